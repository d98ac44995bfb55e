"""What reads, one noun a module: lists (workflows, runs by filter, one run with its lease), stuck (the one
definition), redrive (the waterfall, a re-drive or retry preview), reruns (the runs a rerun selects), health, ops.
Views, the API, the pages and the sweep call these; nothing here changes state; every name is importable from
runs.selectors itself (a module's settings are read where they live). The words about a run are in runs.explain."""

from .health import SWEEP_STALE_INTERVALS, SWEEP_STALE_MARGIN_SECONDS, DatabaseAway, health
from .lists import (
    MAX_PAGE,
    InvalidCursor,
    cursor_decode,
    cursor_encode,
    lease_of,
    leases_cache,
    run_list,
    run_with_lease,
    runs_matching,
    workflow_list_latest,
    workflow_versions,
)
from .ops import (
    approvals_pending,
    budgets_pending,
    bulk_get,
    cancelled_ancestor,
    run_tree_ids,
    run_usage_rollup,
    side_effects_open,
    status_counts,
    sweep_last_redrive,
    sweeps_recent,
)
from .redrive import RetryPlan, redrive_effects, redrive_preview, retry_plan, run_waterfall
from .reruns import rerun_actions, rerun_get, rerun_items, rerun_list, rerun_refusals, rerun_runs
from .stuck import parents_of_moved_children, stuck_lost_lease, stuck_runs, stuck_timer_overdue

__all__ = [
    "MAX_PAGE",
    "SWEEP_STALE_INTERVALS",
    "SWEEP_STALE_MARGIN_SECONDS",
    "DatabaseAway",
    "InvalidCursor",
    "RetryPlan",
    "approvals_pending",
    "budgets_pending",
    "bulk_get",
    "cancelled_ancestor",
    "cursor_decode",
    "cursor_encode",
    "health",
    "lease_of",
    "leases_cache",
    "parents_of_moved_children",
    "redrive_effects",
    "redrive_preview",
    "rerun_actions",
    "rerun_get",
    "rerun_items",
    "rerun_list",
    "rerun_refusals",
    "rerun_runs",
    "retry_plan",
    "run_list",
    "run_tree_ids",
    "run_usage_rollup",
    "run_waterfall",
    "run_with_lease",
    "runs_matching",
    "side_effects_open",
    "status_counts",
    "stuck_lost_lease",
    "stuck_runs",
    "stuck_timer_overdue",
    "sweep_last_redrive",
    "sweeps_recent",
    "workflow_list_latest",
    "workflow_versions",
]

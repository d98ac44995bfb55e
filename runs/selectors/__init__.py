"""What reads, one noun a module: lists (workflows, runs by filter, one run with its lease), stuck (the one
definition), redrive (the waterfall, a re-drive preview), health, ops (what the operator's pages read), decisions
(the inbox). Views, the API, the pages and the sweep call these; nothing here changes state; every name is
importable from runs.selectors itself (a module's settings, such as ops.EXACT_FINISHED_UP_TO, are read where they
live). The words about a run are in runs.explain."""

from .decisions import KINDS as DECISION_KINDS
from .decisions import ORDERS as DECISION_ORDERS
from .decisions import Decision, approval_open, decisions_count, decisions_open
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
from .redrive import redrive_effects, redrive_preview, run_waterfall
from .stuck import parents_of_moved_children, stuck_lost_lease, stuck_runs, stuck_timer_overdue

__all__ = [
    "DECISION_KINDS",
    "DECISION_ORDERS",
    "MAX_PAGE",
    "SWEEP_STALE_INTERVALS",
    "SWEEP_STALE_MARGIN_SECONDS",
    "DatabaseAway",
    "Decision",
    "InvalidCursor",
    "approval_open",
    "approvals_pending",
    "budgets_pending",
    "bulk_get",
    "cancelled_ancestor",
    "cursor_decode",
    "cursor_encode",
    "decisions_count",
    "decisions_open",
    "health",
    "lease_of",
    "leases_cache",
    "parents_of_moved_children",
    "redrive_effects",
    "redrive_preview",
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

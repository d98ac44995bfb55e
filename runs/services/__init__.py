"""What changes state, one noun a module: workflows, ingest (creating runs), wakeups, actions (cancel, re-drive,
retry, budget), move (a run to another version), bulk, side_effects, fork, pauses, reruns, views (saved views),
decisions (approvals decided by people, links and deadlines), timers. Views, the API, admin actions, tasks and
commands call these; every name is importable from runs.services itself, as it has always been."""

from ..errors import Conflict, NotFound, ServiceError
from .actions import (
    journal_head_advance,
    run_budget_raise,
    run_cancel,
    run_end_below_cancelled,
    run_event_append,
    run_redrive,
    run_retry,
    run_retry_preview,
)
from .bulk import BULK_LIMIT, bulk_apply, bulk_preview, bulk_start
from .decisions import approval_decide, approval_decide_by_link, approval_link_open, approvals_time_out
from .fork import FORK_NOTE, run_fork, run_fork_preview
from .ingest import BATCH_LIMIT, run_create, run_create_batch, run_create_child, run_get
from .move import run_move, run_move_preview
from .pauses import pause_create, pause_get, pause_held_count, pause_list, pause_resume
from .reruns import (
    RERUN_LIMIT,
    rerun_abort,
    rerun_advance,
    rerun_filter,
    rerun_plan,
    rerun_preview,
    rerun_start,
)
from .side_effects import SIDE_EFFECT_DECISIONS, side_effect_resolve
from .timers import run_wake_timer
from .views import view_create, view_delete
from .wakeups import run_wake, signal_send
from .workflows import code_workflow_stored, workflow_check, workflow_create, workflow_get

__all__ = [
    "BATCH_LIMIT",
    "BULK_LIMIT",
    "FORK_NOTE",
    "RERUN_LIMIT",
    "SIDE_EFFECT_DECISIONS",
    "Conflict",
    "NotFound",
    "ServiceError",
    "approval_decide",
    "approval_decide_by_link",
    "approval_link_open",
    "approvals_time_out",
    "bulk_apply",
    "bulk_preview",
    "bulk_start",
    "code_workflow_stored",
    "journal_head_advance",
    "pause_create",
    "pause_get",
    "pause_held_count",
    "pause_list",
    "pause_resume",
    "rerun_abort",
    "rerun_advance",
    "rerun_filter",
    "rerun_plan",
    "rerun_preview",
    "rerun_start",
    "run_budget_raise",
    "run_cancel",
    "run_create",
    "run_create_batch",
    "run_create_child",
    "run_end_below_cancelled",
    "run_event_append",
    "run_fork",
    "run_fork_preview",
    "run_get",
    "run_move",
    "run_move_preview",
    "run_redrive",
    "run_retry",
    "run_retry_preview",
    "run_wake",
    "run_wake_timer",
    "side_effect_resolve",
    "signal_send",
    "view_create",
    "view_delete",
    "workflow_check",
    "workflow_create",
    "workflow_get",
]

"""The walk over a run's steps: the only writer of execution status."""

# run_drive(run_id, task_id) takes the run's lease for this worker, replays the journal, and walks the steps
# in order for at most PAL_SLICE_SECONDS:
# - a step whose current attempt has step_completed is reused: its stored output, no call;
# - otherwise step_started is journaled before acting, then step_completed with the full output or step_failed;
# - a step's step_completed and the next step's step_started share one commit (one round trip per step);
# - when the slice is used up the lease is handed to a new task and the run goes back to the queue, so a long
# run cannot starve the others.
# Every write is fenced by the lease epoch: a worker that lost its lease raises FencedOut and stops.

import logging

from django.db import Error as DatabaseError

from journal.services import Fence, FencedOut, events_append
from pal.db_away import CONNECTION_ERRORS

from .. import leases
from ..crashes import crash_note
from ..errors import Interrupted
from ..models import Run
from ..services import run_end_below_cancelled
from .walk import Walk

log = logging.getLogger("pal.executor")


def run_drive(*, run_id, task_id: str) -> str:
    """Walk one slice of a run for the task that carries task_id. Returns what happened, for logs and tests."""
    fence = leases.lease_acquire(run_id=run_id, task_id=task_id)
    if fence is None:
        return "busy"  # another worker holds a live lease; the sweep will look again if it dies
    try:
        run = Run.objects.select_related("workflow").get(id=run_id)
    except Run.DoesNotExist:
        leases.lease_drop(run_id=run_id)
        return "missing"
    try:
        if run.parent_run_id and run_end_below_cancelled(run_id=run.id, by=fence.owner):
            return "cancelled"  # its ancestor was cancelled: it is never driven
        Walk(run, fence).go()
    except FencedOut as exc:
        log.warning("run %s: %s; stopping without writing", run_id, exc)
        return "fenced"
    except (Interrupted, *CONNECTION_ERRORS) as exc:
        # Not the run's failure: its lease is no longer beaten (untracked below), so it expires and the sweep
        # re-drives the run once the database answers again.
        log.warning("run %s: the walk stopped on a database error; the sweep will re-drive it: %s", run_id, exc)
        return "interrupted"
    except Exception as exc:  # a bug of ours (a DataError or IntegrityError too): counted, never re-driven for ever
        log.error("run %s: the walk crashed", run_id, exc_info=exc)
        return _walk_crashed(run, fence, exc)
    finally:
        leases.heartbeat.untrack(fence)
    return "walked"


def _walk_crashed(run: Run, fence: Fence, error: Exception) -> str:
    """Journal a walk's crash under its lease and leave the run to the sweep; the PAL_WALK_CRASHES-th in a row fails
    the run with internal_error instead, handing its slot on (runs.crashes). What the walk had pending is dropped."""
    try:
        crash = crash_note(run_id=run.id, error=error)
        if not crash.final:
            events_append(run_id=run.id, events=[crash.event()], writer=fence.owner, fence=fence)
            return "crashed"
        run.refresh_from_db()
        walk = Walk(run, fence)
        walk.items_booked = True  # what it booked for the fleet goes with its lease
        walk.pending.append(crash.event())
        walk.finish_failed(None, None, crash.failure(), expect=run.status)  # a run that crashed before it started too
        return "failed"
    except FencedOut:
        return "fenced"
    except DatabaseError as exc:
        log.warning("run %s: its crash could not be journaled; the sweep will re-drive it: %s", run.id, exc)
        return "interrupted"

"""Moving a run to another version of its workflow (docs/reference/api.md, "Moves"): previewed, then applied in one
commit, journaled definition_moved with who and why. A carried-over step is never run again; one whose input changed
runs again under a new attempt (a new key); the plan is runs.selectors.move_plan's."""

# Which runs: a JSON workflow's (a Python workflow's versions come from its code: 422 not_a_json_workflow) that has
# not ended (queued, running, waiting) or has failed (a failed run moved, then retried, goes on from its failed step
# on the new version). One that succeeded or was cancelled has ended for good: 409 run_ended.
#
# Leases: the move books the run's lease for a task of its own before it reads the journal, so no walk runs while
# it writes. It takes no lease (an expired one, none for a parked run) or a booking no worker has taken yet (a
# queued run's first task, a run between two slices: that task, when it comes, finds the run booked for another and
# does nothing); a lease a worker holds is refused, 409 lease_held, never stolen: moving the ground under a step
# that is running would let it finish on a definition the plan did not see. Try again once the run parks or the
# slice ends (a slice lasts at most PAL_SLICE_SECONDS).
#
# After the move the run walks the new version: a queued or running one at once (its task is sent after the
# commit), a waiting one when its wait ends, unless its wait is on a step that runs again or is gone (then it goes
# on now, woken as a decision would); a failed one when an operator retries it.

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.services import NewEvent, events_append

from .. import leases, selectors
from ..audit import Audit
from ..code import is_code
from ..dispatch import enqueue_drive
from ..errors import Conflict, NotFound, ServiceError
from ..models import Run, RunStatus, Workflow
from .actions import journal_head_advance
from .ingest import _run_locked, run_get
from .wakeups import run_wake

MOVABLE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.FAILED)


def _target(run: Run, version: Any) -> Workflow:
    """The version of the run's workflow to move to; 422, 409 or 404 naming what is wrong."""
    if is_code(run.workflow.definition):
        raise ServiceError(
            f"{run.workflow.name} is a Python workflow: its versions come from its code, a run cannot move between "
            "them",
            code="not_a_json_workflow",
            status=422,
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ServiceError(f"version: a whole number of 1 or more, not {version!r}", code="invalid_version", status=422)
    if version == run.workflow.version:
        raise Conflict(f"run {run.id} is on {run.workflow} already", code="same_version")
    target = Workflow.objects.filter(name=run.workflow.name, version=version).first()
    if target is None:
        raise NotFound(f"workflow {run.workflow.name!r} has no version {version}", code="version_not_found")
    if is_code(target.definition):
        raise ServiceError(f"{target} is a Python workflow's version", code="not_a_json_workflow", status=422)
    return target


def _movable(run: Run) -> None:
    if run.status not in MOVABLE:
        raise Conflict(f"run {run.id} has ended ({run.status}): there is nothing left to move", code="run_ended")


def run_move_preview(*, run_id, version: int) -> dict:
    """What run_move would do, with its refusals (but lease_held: `held` names the lease a worker walks it under):
    per step carried over, run again, new or pending; the steps gone; the side effects it implies."""
    run = run_get(run_id=run_id)
    target = _target(run, version)
    _movable(run)
    plan = selectors.move_plan(run, target.definition, version=target.version)
    return {**plan.preview, "held": selectors.move_held(run), "applied": False}


def run_move(*, run_id, version: int, audit: Audit) -> dict:
    """Move the run onto another version of its workflow, journaled definition_moved (who, why, what carries over,
    what runs again, what is new); returns the applied preview. 409 run_ended, same_version, lease_held; 404
    version_not_found; 422 not_a_json_workflow."""
    run = run_get(run_id=run_id)
    target = _target(run, version)
    _movable(run)
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        # run_locks, then the run's row: the order every writer uses.
        fence = leases.lease_reserve_unwalked(run_id=run.id, task_id=task_id)
        if fence is None:
            held = leases.lease_describe(run_id=run.id) or {}
            raise Conflict(
                f"run {run.id} is being walked by {held.get('owner')} (epoch {held.get('epoch')}): move it once it "
                "parks or its slice ends",
                code="lease_held",
            )
        locked = _run_locked(run.id)
        if locked is None or locked.status not in MOVABLE:
            raise Conflict(f"run {run.id} has ended ({locked.status if locked else 'deleted'})", code="run_ended")
        if locked.workflow_id != run.workflow_id:
            raise Conflict(f"run {run.id} moved meanwhile (to {locked.workflow}); preview again", code="run_moved")
        plan = selectors.move_plan(locked, target.definition, version=target.version)
        Run.objects.filter(id=run.id).update(workflow=target, updated_at=timezone.now())
        steps = {name: [entry["step_id"] for entry in plan.preview[name]] for name in ("reused", "rerun", "new")}
        moved = {"from": run.workflow.version, "to": target.version}
        summary = audit.payload(
            **moved,
            carried=steps["reused"],
            rerun=steps["rerun"],
            new=steps["new"],
            removed=[entry["step_id"] for entry in plan.preview["removed"]],
        )
        events = [NewEvent("definition_moved", payload=summary)]
        events += [
            NewEvent("definition_moved", sid, attempt, {**moved, "had": had, "why": why})
            for sid, attempt, had, why in plan.rows
        ]
        events_append(run_id=run.id, events=events, writer=audit.by, fence=fence)
        _go_on(locked, fence=fence, task_id=task_id, wakes=plan.wakes, audit=audit, version=target.version)
    return {**plan.preview, "held": None, "applied": True}


def _go_on(run: Run, *, fence, task_id: str, wakes: bool, audit: Audit, version: int) -> None:
    """Inside the move's commit: hand the run on to walk its new version, or leave it where it waits."""
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING) and not (run.status == RunStatus.QUEUED and run.waiting_on):
        enqueue_drive(
            run_id=run.id, task_id=task_id, priority=run.priority
        )  # its booking is ours: the walk replays onto the new version
        return
    # A failed run, a waiting one, or one queued on its concurrency group (a freed slot books it): no task now.
    leases.lease_release(fence=fence)
    if run.status == RunStatus.FAILED:
        journal_head_advance(run_id=run.id)  # an ended run's recorded head moves to the move's rows
    elif wakes:  # it waits on a step that runs again or is gone: it goes on now, as a decision would wake it
        run_wake(run_id=run.id, by=audit.by, why=f"moved to version {version}: {audit.why}")

"""An operator's actions on one run: cancel (with its tree), re-drive, retry, budget, custom events."""

import contextlib
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from journal.selectors import last_event
from journal.services import (
    NewEvent,
    ReservedKind,
    custom_event_append,
    events_append,
    read_tail,
)

from .. import leases, selectors
from ..audit import Audit
from ..concurrency import slot_hand_over, slot_take
from ..dispatch import (
    book_drive,
    booked_task_id,
    enqueue_drive,
)
from ..errors import Conflict, NotFound, ServiceError
from ..models import (
    FINAL_STATUSES,
    LIVE_STATUSES,
    Run,
    RunStatus,
)
from .ingest import _run_locked, run_get
from .wakeups import _root_of, _wake_tree, run_wake


def _parent_waits_on(run_id, parent_id) -> bool:
    return bool(parent_id) and (
        Run.objects.filter(id=parent_id, status=RunStatus.WAITING, waiting_on__child_run_id=str(run_id)).exists()
    )


def _book_after_commit(run_id) -> None:
    """Book a run's walk once the caller's transaction has committed, holding no other lock by then."""
    transaction.on_commit(lambda: book_drive(run_id=run_id), robust=True)  # lost: the sweep books it


def run_cancel(*, run_id, by: str, reason: str) -> Run:
    """Stop a run and every unfinished run below it, in one transaction: their leases are dropped (each holder is
    fenced out at its next write) and they end cancelled, children first, so no kill or lock timeout can leave a
    live child under a cancelled parent (all or nothing)."""
    # A child that its parent waits on wakes the tree, so the parent's walk finds it cancelled. The locks come in the
    # order every writer uses: the lease rows (the deepest runs first, then the run's, then its root's, booked for the
    # walk that goes on, as run_wake books it), then the status rows from the bottom up, then the concurrency groups'
    # rows (tests/services/test_cancel_three_levels.py).
    audit = Audit.of(by=by, reason=reason, action="a cancel")  # refused before anything is read
    try:
        run_uuid = uuid.UUID(str(run_id))
    except ValueError:
        raise NotFound(f"run {run_id} does not exist", code="run_not_found") from None
    now = timezone.now()
    parent_id = Run.objects.filter(id=run_uuid).values_list("parent_run_id", flat=True).first()
    root_id = _root_of(run_uuid) if _parent_waits_on(run_uuid, parent_id) else None
    task_id = str(uuid.uuid4())
    below = _unfinished_below(run_uuid)  # parent links never change: read before any lock
    with transaction.atomic():
        for child_id, _ in below:  # run_locks before runs, the order every writer uses; the deepest first
            leases.lease_drop(run_id=child_id)
        leases.lease_drop(run_id=run_id)  # from here its walk creates no child: its next write is fenced out
        late = [row for row in _unfinished_below(run_uuid) if row not in below]
        for child_id, _ in late:  # created between the read above and the drop
            leases.lease_drop(run_id=child_id)
        booking = leases.lease_reserve(run_id=root_id, task_id=task_id) if root_id not in (None, run_uuid) else None
        keys = {
            key
            for child_id, parent in [*late, *below]
            if (key := _cancelled(child_id, audit=audit.because(f"parent {parent} cancelled: {reason}"), now=now))
            is not None
        }
        key = _cancelled(run_uuid, audit=audit, now=now)
        if key is None:
            run = run_get(run_id=run_id)
            raise Conflict(f"run {run_id} has already ended ({run.status})", code="run_ended")
        for group in sorted({*keys, key} - {""}):  # each group once, in one order for every cancel
            slot_hand_over(group)
        run = Run.objects.get(id=run_id)
        goes_on = None
        if _parent_waits_on(run_id, run.parent_run_id):
            # Its parent waits on it and nothing else would wake it: wake the tree, so the parent's walk finds
            # the child cancelled and fails its step (child_cancelled).
            goes_on = _wake_tree(run, by=by, why=f"child {run_id} cancelled: {reason}")
        if goes_on is not None and goes_on.id == root_id and booking is not None:
            enqueue_drive(run_id=root_id, task_id=task_id, priority=goes_on.priority)
        else:
            if booking is not None:
                leases.lease_release(fence=booking)  # no walk goes on from the root: its booking is not needed
            if goes_on is not None:
                # The root was not booked above (a live lease held it, then it parked on this run; or an ancestor
                # ended since _root_of looked): book it after the commit, with no row of the tree locked. A wake-up
                # that books it meanwhile wins; then this finds its lease and that walk reaches this run.
                _book_after_commit(goes_on.id)
    return run_get(run_id=run_id)


def run_end_below_cancelled(*, run_id, by: str) -> bool:
    """A run whose ancestor was cancelled is never driven: the sweep and the walk end it cancelled instead (True).
    Only a tree cancelled before cancels were one transaction, or rows written by hand, can hold such a run."""
    ancestor = selectors.cancelled_ancestor(run_id)
    if ancestor is None:
        return False
    with contextlib.suppress(Conflict):  # it ended meanwhile
        run_cancel(run_id=run_id, by=by, reason=f"its ancestor {ancestor} was cancelled")
    return True


def _unfinished_below(run_id) -> list[tuple[Any, Any]]:
    """(id, parent id) of every unfinished run below run_id, the deepest first: one query per level."""
    levels, frontier = [], [run_id]
    while frontier:
        level = list(Run.objects.filter(parent_run_id__in=frontier).values_list("id", "parent_run_id"))
        levels.append(level)
        frontier = [child_id for child_id, _ in level]
    unfinished = set(
        Run.objects.filter(id__in=[i for level in levels for i, _ in level])
        .exclude(status__in=FINAL_STATUSES)
        .values_list("id", flat=True)
    )
    return [row for level in reversed(levels) for row in level if row[0] in unfinished]


def _cancelled(run_id, *, audit: Audit, now) -> str | None:
    """Inside run_cancel's transaction, its lease dropped: end one run cancelled, journaled, its head recorded.
    Returns its concurrency group ("" without one, for the caller's hand-over), None when it had ended."""
    updated = (
        Run.objects.filter(id=run_id)
        .exclude(status__in=FINAL_STATUSES)
        .update(status=RunStatus.CANCELLED, finished_at=now, updated_at=now, waiting_on=None, wake_at=None)
    )
    if not updated:
        return None
    head = read_tail(run_id)  # moved to our run_cancelled row by the append: recorded in this commit
    events_append(
        run_id=run_id,
        tail=head,
        events=[NewEvent("run_cancelled", payload=audit.payload(reason=audit.why))],
        writer=audit.by,
    )
    Run.objects.filter(id=run_id).update(journal_head_seq=head.seq, journal_head_hash=head.hash)
    return Run.objects.filter(id=run_id).values_list("concurrency_key", flat=True).first() or ""


def run_redrive(*, run_id, by: str, reason: str, force: bool = False) -> Run:
    """An operator's re-drive: refused while a live lease holds the run unless forced (a steal, new epoch)."""
    # A queued or waiting run asks for a slot of its concurrency group, as a wake-up does (runs.concurrency), forced
    # or not: force steals a lease, it never lets a group run more than max_runs. With a slot, a waiting run goes
    # running in this commit and its task is sent; a queued run's task is sent and its walk starts it (no younger run
    # of the group starts before it: slot_take). Without one, the run stays (or goes) queued on its group with the
    # why, no task is sent, and its run_redriven says so ("queued"): a freed slot starts it in creation order.
    audit = Audit.of(by=by, reason=reason, action="a re-drive")
    run = run_get(run_id=run_id)
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status}); use retry for a failed run", code="run_ended")
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        previous = leases.lease_describe(run_id=run_id)
        # run_locks, then the run's row, then its group's row: the order every writer uses.
        fence = leases.lease_reserve(run_id=run_id, task_id=task_id, force=force)
        if fence is None:
            held = previous or {}  # None: the lease came between the two reads
            raise Conflict(
                f"run {run_id} is held by a live lease ({held.get('owner')}, epoch {held.get('epoch')}, "
                f"until {held.get('expires_at')}); pass force to steal it",
                code="lease_held",
            )
        # The run's row, locked, and its status read under the lock: an ending that committed first is seen (the
        # booking rolls back with the Conflict); a cancel that comes later waits for this commit (its lease_drop
        # writes the lease row booked above).
        locked = _run_locked(run_id)
        if locked is None or locked.status not in (*LIVE_STATUSES, RunStatus.WAITING):
            raise Conflict(f"run {run_id} has ended ({locked.status if locked else 'deleted'})", code="run_ended")
        run = locked
        queued = slot_take(run) if run.status in (RunStatus.QUEUED, RunStatus.WAITING) else None
        fields: dict[str, Any] = {}
        if queued is not None:
            fields = {"status": RunStatus.QUEUED, "waiting_on": queued, "wake_at": None}
        elif run.status == RunStatus.WAITING:
            fields = {"status": RunStatus.RUNNING}  # its slot is taken in this commit
        Run.objects.filter(id=run_id).update(updated_at=timezone.now(), **fields)
        payload = audit.payload(force=force, previous_lease=previous)
        payload["task_id"] = None if queued else booked_task_id(fence)
        if queued is not None:
            payload["queued"] = queued
        events_append(run_id=run_id, events=[NewEvent("run_redriven", payload=payload)], writer=by, fence=fence)
        if queued is not None:
            leases.lease_release(fence=fence)  # no task: a hand-over books the run when a slot frees
        else:
            enqueue_drive(run_id=run_id, task_id=task_id, priority=run.priority)
    return run_get(run_id=run_id)


def run_retry(*, run_id, by: str, reason: str, from_step: str | None = None, rerun_job: dict | None = None) -> Run:
    """A failed run goes on from its failed step with attempt + 1 (a new key); with from_step, that step and every
    step after it in the graph run again too (runs.selectors.retry_plan); the other steps are reused. Journals
    run_retried per step that goes on (with rerun_job, {id, name}, when a rerun asked). Like any start it takes a
    slot of its concurrency group: with one the run goes running and its task is sent; without, it waits queued."""
    audit = Audit.of(by=by, reason=reason, action="a retry")
    plan = run_retry_preview(run=run_get(run_id=run_id), from_step=from_step)
    now = timezone.now()
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        # run_locks, then the run's row, then its group's row: the order every writer uses.
        fence = leases.lease_reserve(run_id=run_id, task_id=task_id)
        if fence is None:
            raise Conflict(f"run {run_id} is held by a live lease", code="lease_held")
        locked = _run_locked(run_id)
        if locked is None or locked.status != RunStatus.FAILED:  # another retry (or anything else) came first
            raise Conflict(f"run {run_id} is no longer failed", code="run_not_failed")
        # A retry is a start: it takes a slot of its concurrency group or waits queued on it (runs.concurrency).
        queued = slot_take(locked)
        Run.objects.filter(id=run_id, status=RunStatus.FAILED).update(
            status=RunStatus.QUEUED if queued else RunStatus.RUNNING,
            waiting_on=queued,
            error=None,
            output=None,
            finished_at=None,
            updated_at=now,
        )
        retried: dict[str, Any] = audit.payload()
        retried["task_id"] = None if queued else booked_task_id(fence)
        if queued is not None:
            retried["queued"] = queued
        if from_step is not None:
            retried["from_step"] = from_step
        if rerun_job is not None:
            retried["rerun_job"] = rerun_job
        # No step to go on (it failed before from_step began): one row still says who retried it and why.
        rows: list[tuple[str | None, int | None, int | None]] = [*plan.rows] or [(None, None, None)]
        events_append(
            run_id=run_id,
            events=[
                NewEvent("run_retried", sid, next_, payload={**retried, "failed_attempt": had})
                for sid, next_, had in rows
            ],
            writer=by,
            fence=fence,
        )
        if queued is not None:
            leases.lease_release(fence=fence)  # no task: a hand-over books the run when a slot frees
        else:
            enqueue_drive(run_id=run_id, task_id=task_id, priority=locked.priority)
    return run_get(run_id=run_id)


def run_retry_preview(*, run: Run, from_step: str | None = None) -> selectors.RetryPlan:
    """What run_retry would journal and what it reuses and runs, with the same refusals (409 run_not_failed,
    no_failed_step; 422 unknown_step naming from_step)."""
    if run.status != RunStatus.FAILED:
        raise Conflict(f"run {run.id} is {run.status}; only a failed run can be retried", code="run_not_failed")
    step_id, attempt = _failed_step(run)
    if step_id is None and from_step is None:
        raise Conflict(f"run {run.id} did not fail in a step, so there is no step to retry", code="no_failed_step")
    # An unknown outcome never makes a new attempt (docs/reference/keys.md): the retry sends it again under the same
    # attempt and key, so the peer can dedup it. A definite failure goes on with attempt + 1. In a graph, other
    # steps or items may have failed too: each goes on as well, so one retry runs every failed one again.
    return selectors.retry_plan(run, failed=(step_id, attempt) if step_id else None, from_step=from_step)


def _failed_step(run: Run) -> tuple[str | None, int]:
    """The step and attempt a failed run failed in: its error, else its last run_failed event."""
    error = run.error if isinstance(run.error, dict) else {}
    if error.get("step_id") and isinstance(error.get("attempt"), int):
        return error["step_id"], error["attempt"]
    last = last_event(run_id=run.id, kind="run_failed")
    if last is None or last.step_id is None:
        return None, 0
    return last.step_id, last.attempt or 1


def run_event_append(*, run_id, kind: str, step_id: str | None, payload: Any, by: str) -> int:
    """A custom event from the API (confidence_evaluated, anomaly_detected ...); reserved kinds are refused."""
    run_get(run_id=run_id)
    try:
        seq = custom_event_append(run_id=run_id, kind=kind, step_id=step_id, payload=payload, writer=by)
    except ReservedKind as exc:
        raise ServiceError(str(exc), code="reserved_kind", status=422) from None
    journal_head_advance(run_id=run_id)
    return seq


def journal_head_advance(*, run_id) -> None:
    """After an append to a run that has ended (a custom event), move its recorded journal head to the new last
    row, so verification does not take that row for a forged one. Conditional on the run having ended by now:
    an append that went in before the ending is covered by the head the ending records (it chains after it)."""
    head = read_tail(run_id)
    (
        Run.objects.filter(id=run_id, status__in=FINAL_STATUSES)
        .filter(Q(journal_head_seq__isnull=True) | Q(journal_head_seq__lt=head.seq))
        .update(journal_head_seq=head.seq, journal_head_hash=head.hash)
    )


# --- budgets --------------------------------------------------------------------------------------


def run_budget_raise(
    *, run_id, by: str, reason: str, max_cost_usd: float | None = None, max_tokens: int | None = None
) -> Run:
    """Raise (or lower) a run's budget caps, journaled budget_raised with who and why; every run of its tree that
    waits on this budget is woken and goes on if the new caps allow (else it waits again)."""
    audit = Audit.of(by=by, reason=reason, action="a budget change")
    if max_cost_usd is None and max_tokens is None:
        raise ServiceError("give max_cost_usd, max_tokens or both", code="invalid_budget", status=422)
    for name, value in (("max_cost_usd", max_cost_usd), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ServiceError(f"{name} must be a number above 0", code="invalid_budget", status=422)
    run = run_get(run_id=run_id)
    if not isinstance((run.workflow.definition or {}).get("budget"), dict):
        raise Conflict(f"run {run_id}'s workflow {run.workflow.name} has no budget", code="no_budget")
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status})", code="run_ended")
    caps = {k: v for k, v in (("max_cost_usd", max_cost_usd), ("max_tokens", max_tokens)) if v is not None}
    events_append(
        run_id=run_id,
        events=[NewEvent("budget_raised", payload={**caps, **audit.payload()})],
        writer=by,
    )
    tree = selectors.run_tree_ids(run)
    for waiting in Run.objects.filter(
        id__in=tree, status=RunStatus.WAITING, waiting_on__kind="budget", waiting_on__run_id=str(run_id)
    ).values_list("id", flat=True):
        run_wake(run_id=waiting, by=by, why=f"budget raised: {reason}", expect={"kind": "budget"})
    return run_get(run_id=run_id)

"""Waking a waiting run and its tree: approvals, signals, timers and the engine's own wake-ups."""

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.services import (
    NewEvent,
    events_append,
)

from .. import leases
from ..concurrency import slot_take
from ..dispatch import (
    book_drive,
    enqueue_drive,
)
from ..errors import Conflict, NotFound, ServiceError
from ..models import (
    FINAL_STATUSES,
    Run,
    RunStatus,
    Signal,
)
from ..steps.base import NAME_RE
from .ingest import _run_locked, run_get

# --- waiting: wake-ups, approvals, signals ---------------------------------------------------------


def _wake_tree(run: Run, *, by: str, why: str) -> Run | None:
    """Inside a transaction, after `run` was flipped from waiting to running: flip every waiting ancestor too (each
    was parked on its child), each taking a slot of its group as it goes, as a woken run does (runs.concurrency).
    Returns the run whose walk goes on, the root (the caller sends its task): children are driven by their parent's
    walk, so the root's walk adopts the woken child and goes on. None when an ancestor's group is full: that one is
    queued on its group (a hand-over books it) and the ones above it go on waiting on it."""
    root = run
    while root.parent_run_id:
        # Its row before its group's (slot_take), the order of every writer: a cancel of this one is ordered
        # before or after this look, and never waits for the group's row while we wait for the run's.
        parent = _run_locked(root.parent_run_id)
        assert parent is not None  # a parent link is a foreign key: the row is there
        held = slot_take(parent) if parent.status == RunStatus.WAITING else None
        flipped = Run.objects.filter(id=parent.id, status=RunStatus.WAITING).update(
            status=RunStatus.QUEUED if held else RunStatus.RUNNING,
            waiting_on=held,
            wake_at=None,
            updated_at=timezone.now(),
        )
        if flipped:
            waited = parent.waiting_on or {}
            events_append(
                run_id=parent.id,
                events=[
                    NewEvent(
                        "run_resumed",
                        waited.get("step_id"),
                        waited.get("attempt"),
                        {
                            "by": by,
                            "why": f"child {root.id} resumed: {why}",
                            "child_run_id": str(root.id),
                            "waited_on": waited,
                            **({"queued": held} if held else {}),
                        },
                    )
                ],
                writer=by,
            )
            if held:
                return None
        elif parent.status in FINAL_STATUSES:
            break  # an orphan: the sweep re-drives it on its own
        root = parent
    return root


def _root_of(run_id) -> Any:
    """The run a wake-up of run_id sends a task for: its topmost ancestor that has not ended (or run_id itself);
    None when there is no such run. Parent links never change, so this is read before any lock."""
    current = run_id
    while True:
        row = Run.objects.filter(id=current).values_list("parent_run_id", "parent_run__status").first()
        if row is None:
            return None if current == run_id else current
        if row[0] is None or row[1] in FINAL_STATUSES:
            return current
        current = row[0]


def _waits_on(waiting_on: Any, expect: dict) -> bool:
    """Whether a run's waiting_on matches expect: the wait itself, or one of several (a graph whose branches each
    wait on something lists them all under "waits")."""
    if not isinstance(waiting_on, dict):
        return not expect
    waits = [waiting_on, *(w for w in waiting_on.get("waits") or [] if isinstance(w, dict))]
    return any(all(wait.get(key) == value for key, value in expect.items()) for wait in waits)


def run_wake(*, run_id, by: str, why: str, expect: dict | None = None, extra_events: list | None = None) -> bool:
    """Wake a waiting run if it still waits on what `expect` says (kind, step_id, name ...). The row is locked
    while that is checked and the conditional update decides every race: of two wake-ups (or two decisions), one
    flips the row and the other gets False."""
    # The woken run asks for a slot of its concurrency group again, as a new run does (it gave its slot back when it
    # parked): without one it goes queued on its group, journaled in its run_resumed ("queued"), and a hand-over
    # starts it in creation order (runs.concurrency).
    try:
        root_id = _root_of(uuid.UUID(str(run_id)))
    except ValueError:
        root_id = None
    if root_id is None:
        raise NotFound(f"run {run_id} does not exist", code="run_not_found")
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        # run_locks before runs, the order every writer uses (a cancel drops the lease, then ends the run; parking
        # and endings release it, then set the status): the root's lease is booked first, then the run's row is
        # locked. Nothing of it stays if the run does not wake, and the booking is given back if no walk goes on.
        booking = leases.lease_reserve(run_id=root_id, task_id=task_id)
        run = _run_locked(run_id)
        if run is None:
            raise NotFound(f"run {run_id} does not exist", code="run_not_found")
        if run.status != RunStatus.WAITING or not _waits_on(run.waiting_on, expect or {}):
            transaction.set_rollback(True)
            return False
        waiting_on = run.waiting_on or {}
        held = slot_take(run)
        flipped = Run.objects.filter(id=run_id, status=RunStatus.WAITING).update(
            status=RunStatus.QUEUED if held else RunStatus.RUNNING,
            waiting_on=held,
            wake_at=None,
            updated_at=timezone.now(),
        )
        if flipped != 1:
            transaction.set_rollback(True)
            return False
        each = [w for w in waiting_on.get("waits") or [] if isinstance(w, dict)] or [waiting_on]
        woken = next((w for w in each if _waits_on(w, expect or {})), waiting_on)  # the wait this wake-up answers
        step_id, attempt = woken.get("step_id"), woken.get("attempt")
        events = [NewEvent(kind, step_id, attempt, payload) for kind, payload in (extra_events or [])]
        resumed = {"by": by, "why": why, "waited_on": waiting_on, **({"queued": held} if held else {})}
        events.append(NewEvent("run_resumed", step_id, attempt, resumed))
        events_append(run_id=run_id, events=events, writer=by)
        goes_on = None if held else _wake_tree(run, by=by, why=why)
        if goes_on is not None and goes_on.id == root_id:
            if booking is not None:  # None: a live lease holds the root; its walk will reach the woken run itself
                enqueue_drive(run_id=root_id, task_id=task_id, priority=run.priority)  # a tree has one priority
        else:
            if booking is not None:
                leases.lease_release(fence=booking)  # no walk goes on from the root: its booking is not needed
            if goes_on is not None:  # an ancestor ended since _root_of looked: the orphan below it goes on
                book_drive(run_id=goes_on.id, priority=goes_on.priority)
    return True


def signal_send(*, run_id, name: str, payload: Any = None, by: str = ""):
    """Keep a signal for the run (returns the Signal row); if it waits on that name now, wake it (its walk
    consumes the signal)."""
    if not NAME_RE.match(name or ""):
        raise ServiceError("a signal name is 1-64 characters of a-z 0-9 - _", code="invalid_signal_name", status=422)
    run = run_get(run_id=run_id)
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status}); a signal would never be consumed", code="run_ended")
    signal = Signal.objects.create(run=run, name=name, payload={} if payload is None else payload, sent_by=by)
    run_wake(run_id=run_id, by=by or "signal", why=f"signal {name!r} arrived", expect={"kind": "signal", "name": name})
    return signal

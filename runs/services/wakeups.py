"""Waking a waiting run and its tree: approvals, signals, timers and the engine's own wake-ups."""

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.selectors import replay_rows_for_step
from journal.services import (
    NewEvent,
    events_append,
)
from pal.clock import db_now

from .. import leases
from ..concurrency import slot_take
from ..dispatch import (
    book_drive,
    enqueue_drive,
    enqueue_wake,
)
from ..errors import Conflict, NotFound, ServiceError
from ..models import (
    FINAL_STATUSES,
    Pause,
    Run,
    RunStatus,
    Signal,
)
from ..replay import MISSING, replay
from ..steps.base import NAME_RE
from ..steps.tools import TOOLS, ArgumentsInvalid
from ..waiting import waits_of
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


def approval_decide(
    *,
    run_id,
    step_id: str,
    approved: bool,
    by: str,
    comment: str = "",
    attempt: int | None = None,
    arguments: dict | None = None,
) -> Run:
    """Record a decision on a pending approval. Only one decision counts, even when two arrive at once.
    A decision is for one attempt of the step: `attempt` when the caller names it (the run page does, from what
    it showed), else the attempt waiting now. A late or doubled decision for attempt 1 therefore never decides
    attempt 2 (a retry's new wait): it answers 409 not_waiting_on_approval. `arguments`: a tool call's edited
    arguments (approve_tools), checked against the tool's type hints (422 naming the field)."""
    run = run_get(run_id=run_id)
    if arguments is not None:
        _arguments_check(run, step_id, arguments)
    if run.status == RunStatus.RUNNING and _approval_decide_in_walk(
        run_id=run_id, step_id=step_id, approved=approved, by=by, comment=comment, attempt=attempt
    ):
        return run_get(run_id=run_id)
    run = run_get(run_id=run_id)  # it may have parked meanwhile: then the decision wakes it
    waiting_on = run.waiting_on or {}
    if attempt is None:
        attempt = next(
            (
                wait.get("attempt")
                for wait in [waiting_on, *(waiting_on.get("waits") or [])]
                if isinstance(wait, dict) and wait.get("step_id") == step_id
            ),
            None,
        )
    expect: dict[str, Any] = {"kind": "approval", "step_id": step_id}
    if attempt is not None:
        expect["attempt"] = attempt  # the conditional wake compares it too: a race with a retry cannot win
    decision = {"approved": bool(approved), "by": by, "comment": comment or "", "attempt": attempt}
    if arguments is not None:
        decision["arguments"] = arguments
    woke = run.status == RunStatus.WAITING and run_wake(
        run_id=run_id,
        by=by,
        why=f"approval {step_id} {'approved' if approved else 'rejected'}",
        expect=expect,
        extra_events=[("approval_decided", decision)],
    )
    if not woke:
        waits = _not_waiting_why(run, waiting_on)
        raise Conflict(
            f"run {run_id} does not wait on approval {step_id!r}"
            + (f" attempt {attempt}" if attempt is not None else "")
            + waits,
            code="not_waiting_on_approval",
        )
    return run_get(run_id=run_id)


def _arguments_check(run: Run, step_id: str, arguments: Any) -> None:
    """Edited arguments fit the tool the run waits to call (runs.steps.tools): else 422 invalid_arguments naming the
    field. A run that does not wait on this approval is left to the decision's own 409."""
    wait = next(
        (w for w in waits_of(run.waiting_on) if w.get("kind") == "approval" and w.get("step_id") == step_id), None
    )
    if wait is None:
        return
    registered = TOOLS.get(wait.get("tool") or "")
    if registered is None:
        raise ServiceError(
            f"approval {step_id!r} is not a tool call's: it takes no arguments", code="invalid_arguments", status=422
        )
    try:
        registered.checked(arguments)
    except ArgumentsInvalid as exc:
        raise ServiceError(
            f"arguments.{exc.field}: {exc.message} (tool {registered.name})", code="invalid_arguments", status=422
        ) from None


def _not_waiting_why(run: Run, waiting_on: dict | None) -> str:
    """What the run does instead of waiting on the approval, for the 409 of a decision that came too soon or late."""
    if waiting_on and waiting_on.get("kind") == "concurrency":
        return (
            f" (it is queued on its concurrency group {waiting_on.get('key')!r}, {waiting_on.get('running')} of"
            f" {waiting_on.get('max_runs')} running: decide once a slot frees and the run waits on the approval again)"
        )
    if waiting_on:
        attempt = f" attempt {waiting_on['attempt']}" if waiting_on.get("attempt") is not None else ""
        return f" (it waits on {waiting_on.get('kind')} {waiting_on.get('step_id')}{attempt})"
    if run.status == RunStatus.RUNNING:
        return f" (it is {run.status}: its other branches are still moving; decide once the run waits)"
    return f" (it is {run.status})"


def _approval_decide_in_walk(*, run_id, step_id: str, approved: bool, by: str, comment: str, attempt) -> bool:
    """A decision on an approval of a graph's branch that parked while other branches still move (the run is
    running): journal it, if the journal shows that approval requested and undecided. The walk reads it when it would
    park the run (runs.walk.walk.Walk.go_waiting writes the status first, then looks, so a decision committed before
    that look is seen; one after finds the run waiting and wakes it). The run's row is locked meanwhile."""
    with transaction.atomic():
        status = Run.objects.select_for_update(no_key=True).filter(id=run_id).values_list("status", flat=True).first()
        if status != RunStatus.RUNNING:
            return False
        # That step's rows alone fold into its state (runs.replay), and only they are read under the lock.
        state = replay(replay_rows_for_step(run_id=run_id, step_id=step_id)).get(step_id)
        if (
            state is None
            or state.output is not MISSING
            or state.failure is not None
            or "approval_requested" not in state.events
            or "approval_decided" in state.events
            or (attempt is not None and attempt != state.attempt)
        ):
            return False
        decision = {"approved": bool(approved), "by": by, "comment": comment or "", "attempt": state.attempt}
        events_append(run_id=run_id, events=[NewEvent("approval_decided", step_id, state.attempt, decision)], writer=by)
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


def run_wake_timer(*, run_id) -> bool:
    """Wake a run whose durable timer is due by the database's clock (sent with a countdown, and by the sweep as a
    backstop). A wake-up that came early (its eta was its sender's clock, ahead of this worker's, or the timer
    fired a moment early) is sent again for what is left; the beat's look wakes the run if that one is late."""
    wake_at = Run.objects.filter(id=run_id, status=RunStatus.WAITING).values_list("wake_at", flat=True).first()
    if wake_at is None:
        return False
    left = (wake_at - db_now()).total_seconds()
    if left > 0:
        enqueue_wake(run_id=run_id, countdown=left)
        return False
    # Any wait with a due wake time: a timer, a rate limit's next slot, or a paced resume's turn (a graph may wait
    # on others too: they go on waiting once the run parks again).
    by, why = "timer", "timer due"
    waiting_on = Run.objects.filter(id=run_id).values_list("waiting_on", flat=True).first()
    paused = next((w for w in waits_of(waiting_on) if w.get("kind") == "paused"), None)
    pause = Pause.objects.filter(id=paused["pause"], resumed_at__isnull=False).first() if paused else None
    if pause is not None and pause.per_second:  # its turn of a paced resume: the run_resumed says whose and why
        by = pause.resumed_by
        why = f"paced resume ({pause.per_second:g}/s) of the pause of {pause.target}: {pause.resume_reason}"
    return run_wake(run_id=run_id, by=by, why=why)

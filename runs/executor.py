"""The walk over a run's steps: the only writer of execution status.

run_drive(run_id, task_id) takes the run's lease for this worker, replays the journal, and walks the steps
in order for at most PAL_SLICE_SECONDS:
- a step whose current attempt has step_completed is reused: its stored output, no call;
- otherwise step_started is journaled before acting, then step_completed with the full output or step_failed;
- a step's step_completed and the next step's step_started share one commit (one round trip per step);
- when the slice is used up the lease is handed to a new task and the run goes back to the queue, so a long
  run cannot starve the others.
Every write is fenced by the lease epoch: a worker that lost its lease raises FencedOut and stops.
"""

import enum
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import transaction
from django.utils import timezone

from journal.selectors import events_of_kind, replay_rows_for_run
from journal.services import Fence, FencedOut, NewEvent, NotJSON, Tail, dumps_json, events_append, read_tail
from pal import telemetry
from pal.clock import db_now

from . import leases
from .branches import (
    FLEET_KINDS,
    Booking,
    ItemRow,
    item_finish,
    item_holds,
    item_take,
    item_take_back,
    items_book,
    items_done,
    items_drop,
    items_of,
)
from .budgets import budget_reached, has_budget
from .capabilities import StepCapabilities
from .concurrency import held_back, slot_hand_over, slot_take
from .crashes import crash_note
from .dispatch import enqueue_drive, enqueue_item, enqueue_wake
from .errors import Interrupted, LeaseLost, SliceOver, StepError, Wait, outcome_unknown
from .expressions import when_true
from .graph import needs_of, order
from .models import FINAL_STATUSES, Run, RunStatus, Signal
from .replay import MISSING, StepState, item_id, replay, step_key
from .secrets import redact
from .services import run_end_below_cancelled, run_wake
from .steps.base import StepContext
from .workflows import DEFAULT_MAX_CONCURRENCY, for_each_items, output_of, step_fields, step_invoke, step_policy
from .writer import JournalWriter

log = logging.getLogger("pal.executor")

# A step whose attempts take less than this runs its ready branches on the walk's own thread, one after another:
# handing a no-op tool to a thread (and its outcome back) costs more than running it.
QUICK_SECONDS = 0.002


class Result(enum.Enum):
    DONE = "done"  # the step's output is stored (step_completed pending)
    FAILED = "failed"  # a definite failure (step_failed pending)
    WAITING = "waiting"  # the run parked on the step (journaled, lease released)
    RETRY_LATER = "retry_later"  # an outcome we could not know (step_retrying pending): the same attempt later


@dataclass(frozen=True)
class Outcome:
    """What one attempt of a step came to; delay: seconds before trying again (RETRY_LATER)."""

    result: Result
    delay: float = 0.0


DONE, FAILED, WAITING = Outcome(Result.DONE), Outcome(Result.FAILED), Outcome(Result.WAITING)
# What telemetry calls each (the span's pal.outcome, the step histogram's label).
OUTCOME_WORDS = {
    Result.DONE: "completed",
    Result.FAILED: "failed",
    Result.WAITING: "waiting",
    Result.RETRY_LATER: "unknown",
}


class Walk(JournalWriter):
    """One walk of a run: the journal's writer for it (JournalWriter: the tail is known from the replay)."""

    def __init__(self, run: Run, fence: Fence, *, nested: bool = False):
        super().__init__(run, fence)
        self.run_text = str(run.id)  # what every step's key and context say of the run: written out once
        self.nested = nested  # a child driven inline by its parent's walk: no slicing, no handoff
        self.definition = run.workflow.definition
        self.outputs: dict[str, Any] = {}
        self.step_context: dict[str, dict] = {}  # {id: {"output": ...}} for templates, grown as steps finish
        self.deadline: float | None = None  # the slice's end (a child driven inline shares its root's)
        self.replayed_seq = 0  # the journal's last seq when this walk replayed it
        self.decisions_seen: set[int] = set()  # approval_decided rows journaled by others during this walk
        self.items_booked = False  # this walk booked items for the fleet (runs.branches): their rows go at its end

    def remember(self, step_id, output):
        self.outputs[step_id] = output
        self.step_context[step_id] = {"output": output}

    # --- child runs ------------------------------------------------------------------------------

    def drive_child(self, child: Run, *, step_id: str, attempt: int) -> None:
        """Walk a child of one of our steps inline, under a lease of its own, within our slice."""
        child_fence = leases.lease_take(run_id=child.id)
        walk = Walk(child, child_fence, nested=True)
        walk.deadline = self.deadline  # the root's slice: a long child hands the whole tree back in time
        try:
            walk.go()
        except SliceOver:
            self.pending.append(NewEvent("child_sliced", step_id, attempt, {"child_run_id": str(child.id)}))
            raise
        except FencedOut:
            # The child's walk lost its lease: if the child was cancelled (or ended) on its own, that is this
            # step's outcome; otherwise someone took the child from us and we stop too.
            child.refresh_from_db()
            if child.status not in FINAL_STATUSES:
                raise
        finally:
            leases.heartbeat.untrack(child_fence)

    # --- waiting ---------------------------------------------------------------------------------

    def go_waiting(self, parked: list["Branch"]) -> list["Branch"]:
        """Park the run on every branch that waits (nothing else can move): journal why, give up the lease, hold no
        worker. A timer also sends a wake-up task. waiting_on is the first wait, with all of them under "waits"
        when there are several (a wake-up matches any of them: runs.services.run_wake).

        Parking on a child is conditional on the child still waiting, read under a lock on the child's row: a
        wake-up of the child (which flips the child, then its waiting ancestors) is ordered before or after this
        commit, never in between. Returns the branches whose child moved first: then nothing was written and the
        caller drives them on."""
        with transaction.atomic():
            moved = [
                branch
                for branch in parked
                if branch.waits_on_child() and _child_status_locked(branch.wait_on["child_run_id"]) != RunStatus.WAITING
            ]
            if moved:
                return moved
            # A wait on a child first: the sweep's rule for a parent parked on a child that moved reads the first.
            waits = [branch.wait_on for branch in sorted(parked, key=lambda b: not b.waits_on_child())]
            waiting_on = waits[0] if len(waits) == 1 else {**waits[0], "waits": waits}
            wake_at = min((b.wait.wake_at for b in parked if b.wait and b.wait.wake_at), default=None)
            # run_locks before runs, the order every writer uses (a cancel drops the lease, then ends the run).
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            # Then the status: it locks the run's row, so a decision taken meanwhile on a parked branch
            # (runs.services.approval_decide of a running run) is committed before the look below, or finds the
            # run waiting and wakes it.
            self.set_status(RunStatus.WAITING, waiting_on=waiting_on, wake_at=wake_at)
            decided = self.decided_meanwhile(parked)
            if decided:
                transaction.set_rollback(True)  # nothing of this parking stays: the lease is ours again
                leases.heartbeat.track(self.fence)
                return decided
            slot_hand_over(self.run.concurrency_key)  # a waiting run gives its slot back
            self.commit([event for branch in parked for event in branch.park_events])
            if wake_at is not None:
                # wake_at is by the database's clock (pal.clock): so is what is left of it. The message's own
                # eta is the sender's clock plus that; the beat's look (runs.recovery.recovery_look) is the
                # backstop for a receiver whose clock disagrees.
                left = (wake_at - db_now()).total_seconds()
                enqueue_wake(run_id=self.run.id, countdown=max(0.0, left))
        for name in {w["name"] for w in waits if w.get("kind") == "signal"}:
            # A signal sent between our look and this commit found the run not yet waiting: wake it ourselves.
            if Signal.objects.filter(run_id=self.run.id, name=name, consumed_at__isnull=True).exists():
                run_wake(
                    run_id=self.run.id,
                    by="engine",
                    why="a signal arrived while the run was parking",
                    expect={"kind": "signal", "name": name},
                )
                break
        return []

    def park_on_budget(self, waiting_on: dict) -> None:
        """Park the run on a reached budget: nothing more starts until an operator raises the cap."""
        with transaction.atomic():
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            # The status before the journal, the order every writer of both uses (Walk.finish, go_waiting, a
            # decision taken in the walk): a decision holding the run's row never waits on our journal row.
            self.set_status(RunStatus.WAITING, waiting_on=waiting_on, wake_at=None)
            slot_hand_over(self.run.concurrency_key)
            self.commit([NewEvent("run_waiting", None, None, {"waiting_on": waiting_on})])

    def decided_meanwhile(self, parked: list["Branch"]) -> list["Branch"]:
        """The parked approvals decided while the walk went on with other branches (their decision now on them)."""
        asking = {b.sid: b for b in parked if b.wait_on.get("kind") == "approval"}
        if not asking:
            return []
        found = []
        for event in events_of_kind(run_id=self.run.id, kind="approval_decided", step_ids=list(asking)):
            branch = asking.get(event.step_id or "")
            if event.seq <= self.replayed_seq or event.seq in self.decisions_seen or branch is None:
                continue  # known to the replay already, or taken in this walk before
            self.decisions_seen.add(event.seq)
            payload = event.payload if isinstance(event.payload, dict) else {}
            if event.attempt == branch.state.attempt and branch not in found:
                branch.state.events["approval_decided"] = payload
                found.append(branch)
        return found

    def sleep_fenced(self, seconds: float):
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))
            if leases.heartbeat.lost(self.fence):
                raise FencedOut(self.fence)

    # --- the walk --------------------------------------------------------------------------------

    def go(self):
        run = self.run
        if run.status in FINAL_STATUSES or run.status == RunStatus.WAITING:
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            return
        # The replay's read gives the tail, so run_started chains without reading it (replay skips run_started).
        rows = replay_rows_for_run(run_id=run.id)
        self.tail = Tail(rows[-1].seq, rows[-1].hash) if rows else Tail()
        self.replayed_seq = self.tail.seq
        if run.status == RunStatus.QUEUED:
            with transaction.atomic():
                # run_locks before the group's row, the order every writer uses (a cancel drops the lease, ends
                # the run, then hands its slot on): the lease row is held (FOR SHARE) first; a cancel waits for us.
                leases.fence_check(self.fence)
                over_limit = slot_take(run)
                if over_limit is not None:
                    # Over its group's limit: it stays queued, holding no lease and no task, until a run of the
                    # group hands it a slot (runs.concurrency).
                    leases.lease_release(fence=self.fence, branches=self.items_booked)
                    Run.objects.filter(id=run.id, status=RunStatus.QUEUED).update(
                        waiting_on=over_limit, updated_at=timezone.now()
                    )
                    return None
                # A run woken, then held back by its group, started before: its start time stays.
                again = {"resumed": True} if run.started_at else {}
                self.append([NewEvent("run_started", payload={"worker": self.writer, **again})])
                started_at = run.started_at or timezone.now()
                self.set_status(RunStatus.RUNNING, expect=RunStatus.QUEUED, started_at=started_at, waiting_on=None)
        if self.deadline is None:
            self.deadline = time.monotonic() + settings.PAL_SLICE_SECONDS
        graph = Graph(self, replay(rows))
        try:
            return graph.run()
        finally:
            graph.close()

    @staticmethod
    def next_try(state: StepState):
        """After a step_failed with tries left: a definite failure goes on with attempt + 1 (a new key); an unknown
        outcome never makes a new attempt, so the same attempt runs again under the same key
        (docs/reference/keys.md)."""
        if outcome_unknown(state.failure):
            state.started, state.failure, state.unknown_tries = True, None, 0
        else:
            state.attempt, state.started, state.failure, state.events = state.attempt + 1, False, None, {}
        state.waiting = False  # the next try journals its own step_started (and, for an approval, its request)

    def set_status(self, status: str, *, expect: str = RunStatus.RUNNING, **fields):
        """Every status change the walk makes is a conditional write naming the status it expects: a run that an
        operator cancelled (or anything else moved) meanwhile is not overwritten; the walk stops instead."""
        now = timezone.now()
        moved = Run.objects.filter(id=self.run.id, status=expect).update(status=status, updated_at=now, **fields)
        if moved != 1:
            raise FencedOut(self.fence)  # inside the caller's transaction: everything it wrote rolls back

    def context(self, item: tuple[int, Any] | None = None) -> dict:
        """What templates and `when` read: the run's input, the outputs of the steps so far, and an item's value
        and index inside a for_each step."""
        context: dict[str, Any] = {"input": self.run.input, "steps": self.step_context}
        if item is not None:
            context["index"], context["item"] = item
        return context

    def begin(self, branch: "Branch", *, journal: bool = True) -> StepContext:
        """Journal (pending) that a branch's attempt starts and make its context: the walk's thread only. journal
        False: an item that a worker runs already (left by an earlier walk of this run): its context only."""
        state, sid, attempt = branch.state, branch.sid, branch.state.attempt
        key = step_key(self.run_text, sid, attempt)
        resumed = state.started
        # A resumed attempt (started before a crash) is journaled again with resumed=true, so the waterfall
        # shows when it really ran; the attempt and its key stay the same.
        try:
            # Rendered here, on the walk's thread, before anything else can end: the fields are the branch's
            # input, fixed when it began (no copy of the steps so far, which grow with the run, at every step).
            branch.fields = step_fields(branch.step, context=self.context(branch.item))
        except StepError as exc:  # a template that reads what is not there: the attempt's definite failure
            branch.fields, branch.problem = None, exc
        if journal and not state.waiting:  # a step woken from its wait goes on; it did not start again
            self.journal_start(branch, key, resumed=resumed)
        state.started = True
        capabilities = StepCapabilities(
            self, step_id=sid, attempt=attempt, key=key, state=state, drive_child=self.drive_child
        )
        ctx = capabilities.context(
            run_id=self.run_text,
            resumed=resumed,
            timeout=branch.step.get("timeout_seconds"),
            emit=self.emit(sid, attempt),
            lease_lost=lambda: leases.heartbeat.lost(self.fence),
        )
        branch.ctx, branch.began = ctx, time.monotonic()
        if ctx.timeout:
            ctx.deadline = branch.began + float(ctx.timeout)
        item = branch.item[0] if branch.item is not None else None
        telemetry.step_span_begin(
            run=self.run, step_id=sid, kind=branch.step["kind"], attempt=attempt, key=key, item=item
        )
        return ctx

    def journal_start(self, branch: "Branch", key: str, *, resumed: bool) -> None:
        """step_started of a branch's attempt (pending). A resumed attempt (after a crash, an unknown outcome, or
        on another worker) has the same input: journaled once, with its first start."""
        payload: dict[str, Any] = {"key": key, "kind": branch.step["kind"]}
        if branch.item is not None:
            payload["item"] = branch.item[0]
        if resumed:
            payload["resumed"] = True
        elif branch.fields is not None:
            payload["input"] = redact(branch.fields)
        self.pending.append(NewEvent("step_started", branch.sid, branch.state.attempt, payload))

    def settle(self, branch: "Branch", output: Any, error: BaseException | None) -> Outcome:
        """What a branch's attempt came to, journaled (pending): the walk's thread only. Telemetry gets the
        outcome as the walk decided it (outcome_of), so the two never disagree."""
        sid, ctx = branch.sid, branch.ctx
        assert ctx is not None
        payload: dict[str, Any] = {}
        payload_json: str | None = None
        if error is None:
            payload = {**ctx.extra, "output": output, "ms": round((time.monotonic() - branch.began) * 1000, 3)}
            try:  # written out here, once: an output that is not JSON fails its step, not the commit after it
                payload_json = dumps_json(payload, what=f"what step {sid} returned")
            except NotJSON as exc:
                error = StepError(str(exc), code="internal_error")
        try:
            outcome = self.outcome_of(branch, output, error, payload, payload_json)
        except BaseException:
            # Not the attempt's outcome: the walk stopped under it (fenced out, its slice over, the database
            # failed, the process dying).
            telemetry.step_span_end(kind=branch.step["kind"], key=ctx.key, began=branch.began, outcome="stopped")
            raise
        telemetry.step_span_end(
            kind=branch.step["kind"],
            key=ctx.key,
            began=branch.began,
            outcome=OUTCOME_WORDS[outcome.result],
            output=output,
            error=error,
        )
        return outcome

    def outcome_of(
        self, branch: "Branch", output: Any, error: BaseException | None, payload: dict, payload_json: str | None
    ) -> Outcome:
        """settle's rule: journal (pending) what the attempt came to and say which; raises when it came to none."""
        state, sid, attempt = branch.state, branch.sid, branch.state.attempt
        failure: dict[str, Any]
        if error is None:
            self.pending.append(NewEvent("step_completed", sid, attempt, payload, payload_json=payload_json))
            if branch.item is None:
                self.remember(sid, output)
            state.output = output
            return DONE
        if isinstance(error, (LeaseLost, FencedOut)):
            raise FencedOut(self.fence) from None
        if isinstance(error, (SliceOver, Interrupted)) or not isinstance(error, Exception):
            raise error  # a slice used up by a child, or the process dying (tests' Crash): not the step's outcome
        if isinstance(error, DatabaseError):
            # Our own store failed under the step (a claim, a confirm, a signal, a child): that says nothing about
            # the step, so no step_failed. The walk stops; the lease expires and the sweep re-drives the run.
            raise Interrupted(f"the database failed during step {sid} of run {self.run.id}: {error}") from error
        if isinstance(error, Wait):
            branch.wait = error
            branch.park_events = [NewEvent(kind, sid, attempt, payload) for kind, payload in error.journal]
            branch.park_events.append(NewEvent("run_waiting", sid, attempt, {"waiting_on": error.waiting_on}))
            return WAITING
        if isinstance(error, StepError):
            failure = error.as_payload()
            if not error.permanent and state.unknown_tries < settings.PAL_UNKNOWN_RETRIES:
                # An outcome we do not know (a timeout, a connection lost after sending): not a step_failed.
                # The same attempt runs again later with the same key, so the peer can dedup it.
                state.unknown_tries += 1
                delay = min(2.0**state.unknown_tries, 60.0)
                self.pending.append(
                    NewEvent(
                        "step_retrying",
                        sid,
                        attempt,
                        {**failure, "try": state.unknown_tries, "retry_in_seconds": delay},
                    )
                )
                return Outcome(Result.RETRY_LATER, delay)
        else:  # a bug in a tool must fail the step, not wedge the run in a loop of crashes
            log.error("step %s of run %s raised", sid, self.run.id, exc_info=error)
            failure = StepError(f"{type(error).__name__}: {error}", code="internal_error").as_payload()
        failure["ms"] = round((time.monotonic() - branch.began) * 1000, 3)
        self.pending.append(NewEvent("step_failed", sid, attempt, failure))
        state.failure = failure
        return FAILED

    # --- endings ---------------------------------------------------------------------------------

    def handoff(self, *, reason: str, delay: float = 0.0, retry_step: str | None = None):
        """Give the run back to the queue: the lease goes to a new task id, sent after commit."""
        task_id = str(uuid.uuid4())
        with transaction.atomic():
            new_fence = leases.lease_handoff(fence=self.fence, task_id=task_id, delay=delay)
            if reason == "backoff":
                self.pending.append(
                    NewEvent(
                        "run_backoff",
                        retry_step,
                        None,
                        {"seconds": delay, "until": (timezone.now() + timedelta(seconds=delay)).isoformat()},
                    )
                )
            self.commit()
            enqueue_drive(run_id=self.run.id, task_id=task_id, countdown=delay)
        log.debug("run %s handed off (%s) to task %s epoch %s", self.run.id, reason, task_id, new_fence.epoch)

    def head(self) -> Tail:
        """The journal's last row after our append (events_append moved self.tail to it), recorded on the run
        row in the same commit as the run's ending so that verification sees rows cut off the end."""
        return self.tail if self.tail is not None else read_tail(self.run.id)

    def end_slice(self):
        """The slice is used up: the root hands its run to a new task (handoff); a child driven inline journals
        what is pending and gives its lease back (so the next slice, on any worker, takes it at once), then
        raises SliceOver for its parent to do the same."""
        if not self.nested:
            return self.handoff(reason="slice")
        with transaction.atomic():
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            self.commit()
        raise SliceOver()

    def finish_succeeded(self):
        try:
            output = output_of(self.definition, self.context())
        except StepError as exc:  # the workflow's output reads what is not there (a skipped step's field)
            return self.finish_failed(None, None, exc.as_payload())
        self.finish(
            RunStatus.SUCCEEDED, NewEvent("run_succeeded", payload={"output": output}), output=output, error=None
        )

    def finish_failed(self, step_id: str | None, attempt: int | None, failure: dict, *, expect=RunStatus.RUNNING):
        error = {"step_id": step_id, "attempt": attempt, **{k: v for k, v in failure.items() if k != "ms"}}
        event = NewEvent("run_failed", step_id, attempt, {"error": error})
        self.finish(RunStatus.FAILED, event, error=error, expect=expect)

    def finish(self, status: str, event: NewEvent, **fields):
        """End the run in one commit: release the lease, journal the ending, record the journal's head. A child
        that ends outside its parent's walk (an operator re-drove it) moves a parent that waits on it."""
        now = timezone.now()
        with transaction.atomic():
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            # The status first, then the journal (the order of go_waiting and of a decision taken in the walk, which
            # locks the run's row, then appends): the head, known only after the append, in a second write.
            self.set_status(status, finished_at=now, waiting_on=None, **fields)
            self.commit([event])
            head = self.head()
            Run.objects.filter(id=self.run.id).update(journal_head_seq=head.seq, journal_head_hash=head.hash)
            slot_hand_over(self.run.concurrency_key)
            if self.run.parent_run_id and not self.nested:
                _wake_parent_of(self.run, by=self.writer, why=f"child {self.run.id} ended {status}")


@dataclass(eq=False)
class Branch:
    """One step, or one item of a for_each step, as the walk runs it: its journal id, definition and state."""

    sid: str  # the journal's step id: the step's, or "{step}[{index}]" for an item
    step: dict
    state: StepState
    item: tuple[int, Any] | None = None  # (index, value) of a for_each item
    ctx: StepContext | None = None
    began: float = 0.0
    wait: Wait | None = None  # it parked on this (an approval, a signal, a timer, a child)
    park_events: list = field(default_factory=list)
    due: float = 0.0  # time.monotonic() before which it does not go again (a backoff, an unknown outcome)
    handoff_reason: str = ""
    fleet: bool = False  # booked for the fleet (runs.branches): a worker runs it, its outcome comes in its row
    booking: str = ""  # the booking's owner ("task:<id>") while no worker has taken it
    booked_at: float = 0.0  # time.monotonic() when it was booked
    took: float = 0.0  # seconds its code took, once it came to an outcome

    @property
    def wait_on(self) -> dict:
        assert self.wait is not None
        return self.wait.waiting_on

    fields: dict | None = None  # its fields as its kind gets them (rendered when it began)
    problem: StepError | None = None  # its fields could not be rendered

    def context(self) -> StepContext:
        assert self.ctx is not None, "a branch has its context once the walk began it"
        return self.ctx

    def invoke(self) -> Any:
        """The step's own code, with the fields rendered when it began (on the walk's thread)."""
        if self.problem is not None:
            raise self.problem
        return step_invoke(self.step, self.context(), context={}, fields=self.fields)

    def waits_on_child(self) -> bool:
        return self.wait is not None and self.wait.waiting_on.get("kind") == "child"


class Forward:
    """Runs on the walk's thread what a branch's thread asks for (a claim, a confirm, a signal, a child, an event):
    the walk's thread alone holds the database connection, the journal's tail and the fence, so every write of the
    run stays fenced and in order. A call from the walk's thread itself runs at once."""

    def __init__(self):
        self.owner = threading.current_thread()
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.closed = False

    def wrap(self, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            if threading.current_thread() is self.owner:
                return fn(*args, **kwargs)
            reply: Future = Future()
            with self.lock:
                if self.closed:
                    raise LeaseLost("the walk of this run has stopped")
                self.inbox.put(("call", fn, args, kwargs, reply))
            return reply.result()

        return call

    def close(self) -> None:
        """Stop: a branch still running gets LeaseLost at its next call (it writes and sends nothing more)."""
        with self.lock:
            self.closed = True
            while True:
                try:
                    message = self.inbox.get_nowait()
                except queue.Empty:
                    return
                if message[0] == "call":
                    message[4].set_exception(LeaseLost("the walk of this run has stopped"))


class Graph:
    """The walk over a run's steps as a graph: every step whose needs have ended runs at the same time as the other
    ready ones (and each for_each step runs up to max_concurrency items at a time), each on a thread of its own while
    more than one runs; a lone step runs on the walk's thread, as a plain list always did. A branch that waits parks;
    the run parks when nothing else can move. The walk's thread does all the journaling, in the order outcomes come.
    """

    def __init__(self, walk: Walk, states: dict[str, StepState]):
        self.walk = walk
        self.states = states
        self.steps = walk.definition["steps"]
        self.by_id = {step["id"]: step for step in self.steps}
        self.needs = needs_of(self.steps)
        self.order = order(self.steps)
        # The frontier: the steps whose needs have all ended and that are not known to have ended themselves. A
        # step that ends hands the frontier its dependents whose last need it was, so finding what is ready looks
        # at the frontier only, never at the whole graph again (a plain list of 1,000 steps: one step per look).
        self.position = {step_id: index for index, step_id in enumerate(self.order)}
        self.dependents: dict[str, list[str]] = {step_id: [] for step_id in self.order}
        for step_id, needs in self.needs.items():
            for need in needs:
                self.dependents[need].append(step_id)
        self.open_needs = {step_id: len(self.needs[step_id]) for step_id in self.order}
        self.frontier = {step_id for step_id in self.order if not self.needs[step_id]}
        self.forward = Forward()
        self.pool: ThreadPoolExecutor | None = None
        self.running: dict[str, Branch] = {}
        self.parked: dict[str, Branch] = {}
        self.later: dict[str, Branch] = {}  # branches waiting for their `due` (a backoff, an unknown outcome)
        self.items: dict[str, list] = {}  # a for_each step's items, rendered once its needs ended
        self.items_open: dict[str, list[int]] = {}  # the indices of a for_each step's items not ended yet
        self.failed: Branch | None = None
        self.stopping = False  # the slice is used up (or a child used it up): start nothing new
        self.walked = 0
        self.budgeted = has_budget(walk.run)  # the run or an ancestor has a budget: check it before each start
        self.over_budget: dict | None = None  # a cap reached: start nothing new, park once the others end
        # Items for the whole fleet (runs.branches): only a graph that can start several branches at once books
        # any, and only such a run can have rows left by an earlier walk of it (a crash) to adopt.
        self.fleet = settings.PAL_ITEMS_ACROSS_WORKERS and any(
            "for_each" in step or "needs" in step for step in self.steps
        )
        self.left: dict[str, ItemRow] = items_of(run_id=walk.run.id) if self.fleet else {}
        # Rows of an earlier walk that this one will not wait for go in its first commit: it runs those items anew
        # (booked again under a new epoch, or on its own threads), so a late message for an old booking (the fleet
        # was busy) takes nothing and a frozen worker of one writes nothing.
        self.drop_left([sid for sid, row in self.left.items() if not self.adoptable(row, self.states.get(sid))])
        walk.items_booked = walk.items_booked or bool(self.left)
        self.next_poll = 0.0
        # How many branches the fleet may hold at once: one more each time a worker takes a booking, half as many
        # each time the walk had to take one back (the fleet is busy). The rest run on the walk's threads at once,
        # so a busy fleet costs a fan-out nothing and an idle one takes more and more of it.
        self.fleet_window = 2
        self.took: dict[str, float] = {}  # per step: how long its attempts' code took (a moving average), seconds

    @staticmethod
    def adoptable(left: ItemRow, state: StepState | None) -> bool:
        """An earlier walk's item row that this walk waits for: the same attempt, started and not waiting, with its
        outcome in, or taken by a worker whose lease is live."""
        return (
            state is not None
            and state.output is MISSING
            and left.attempt == state.attempt
            and state.started
            and not state.waiting
            and (left.result is not None or (not left.booked and left.live))  # live by the database's clock
        )

    def drop_left(self, sids: list[str]) -> None:
        """Delete these rows of an earlier walk in a fenced commit (runs.branches.items_drop)."""
        if not sids:
            return
        with transaction.atomic():
            leases.fence_check(self.walk.fence)
            items_drop(run_id=self.walk.run.id, sids=sids)
        for sid in sids:
            self.left.pop(sid, None)

    def close(self) -> None:
        self.forward.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    # --- what is ready ---------------------------------------------------------------------------

    def done(self, step_id: str) -> bool:
        state = self.states.get(step_id)
        return state is not None and state.output is not MISSING

    def busy(self, sid: str) -> bool:
        return sid in self.running or sid in self.parked or sid in self.later

    def ready(self) -> list[Branch]:
        """The branches to start now; journals (pending) the skips and the fan-outs' ends it finds on the way."""
        walk = self.walk
        taken: dict[str, Branch] = {}
        changed = True
        while changed:
            changed = False
            for step_id in sorted(self.frontier, key=self.position.__getitem__):
                state = self.states.setdefault(step_id, StepState())
                if state.output is not MISSING:
                    if step_id not in walk.step_context:
                        walk.remember(step_id, state.output)
                    self.frontier.discard(step_id)
                    for dependent in self.dependents[step_id]:
                        self.open_needs[dependent] -= 1
                        if not self.open_needs[dependent]:
                            self.frontier.add(dependent)
                    changed = True
                    continue
                if step_id in taken or self.busy(step_id):
                    continue
                step = self.by_id[step_id]
                if "when" in step and not state.started:
                    try:
                        go_on, value = when_true(step["when"], walk.context())
                    except StepError as exc:  # a comparison the data cannot make ("7" > 5): the step's failure
                        self.fail_unstarted(step, state, exc)
                        continue
                    if not go_on:
                        payload = {"when": step["when"], "value": value}
                        walk.pending.append(NewEvent("step_skipped", step_id, None, payload))
                        state.output, state.skipped = None, True
                        walk.remember(step_id, None)
                        changed = True
                        continue
                if "for_each" in step:
                    changed = self.items_ready(step, state, taken) or changed
                    continue
                branch = self.retry_or_fail(Branch(step_id, step, state))
                if branch is not None:
                    taken[step_id] = branch
        return [] if self.failed is not None else list(taken.values())

    def fail_unstarted(self, step: dict, state: StepState, error: StepError) -> None:
        """A step that fails before it starts (its `when` or its for_each's items cannot be worked out): a definite
        failure that no retry mends, journaled step_failed (pending); the run fails once the others end."""
        failure = {**error.as_payload(), "ms": 0.0}
        self.walk.pending.append(NewEvent("step_failed", step["id"], state.attempt, failure))
        state.failure, state.failed_tries = failure, state.failed_tries + 1
        self.failed = self.failed or Branch(step["id"], step, state)

    def retry_or_fail(self, branch: Branch) -> Branch | None:
        """A branch whose last try failed: its next try, or None when its attempts are spent (the run fails)."""
        state = branch.state
        if state.failure is None:
            return branch
        max_attempts, _backoff = step_policy(branch.step)
        if state.failed_tries >= max_attempts:
            self.failed = self.failed or branch
            return None
        self.walk.next_try(state)
        return branch

    def items_ready(self, step: dict, state: StepState, taken: dict[str, Branch]) -> bool:
        """Take the items of a for_each step to start now (at most max_concurrency running) into `taken`; True when
        the step just ended (every item has its output: the step's output is their list, in order)."""
        walk, step_id = self.walk, step["id"]
        items = self.items.get(step_id)
        if items is None:
            try:
                items = for_each_items(step, walk.context())
            except StepError as exc:
                self.fail_unstarted(step, state, exc)
                return False
            self.items[step_id] = items
            if not state.started:
                key = step_key(walk.run.id, step_id, state.attempt)
                payload = {"key": key, "kind": step["kind"], "items": len(items)}
                walk.pending.append(NewEvent("step_started", step_id, state.attempt, payload))
                state.started = True
        pending = self.items_open.get(step_id)
        if pending is None:  # the items without an output yet, in order: each look walks only their front
            pending = self.items_open[step_id] = [
                index
                for index in range(len(items))
                if self.states.setdefault(item_id(step_id, index), StepState()).output is MISSING
            ]
        limit = int(step.get("max_concurrency", DEFAULT_MAX_CONCURRENCY))
        prefix = step_id + "["
        in_flight = sum(1 for sid in (*self.running, *taken) if sid.startswith(prefix))
        kept: list[int] = []
        looked = 0
        for index in pending:
            if in_flight >= limit:
                break  # nothing more may start: the rest waits for the next look
            looked += 1
            sid = item_id(step_id, index)
            item_state = self.states[sid]
            if item_state.output is not MISSING:
                continue  # ended since the last look: off the list
            kept.append(index)
            if sid in taken or self.busy(sid):
                continue
            branch = self.retry_or_fail(Branch(sid, step, item_state, item=(index, items[index])))
            if branch is None:
                pending[:looked] = kept
                return False
            taken[sid] = branch
            in_flight += 1
        pending[:looked] = kept
        if pending:
            return False
        outputs = [self.states[item_id(step_id, index)].output for index in range(len(items))]
        walk.pending.append(
            NewEvent("step_completed", step_id, state.attempt, {"output": outputs, "items": len(items)})
        )
        state.output = outputs
        walk.remember(step_id, outputs)
        return True

    # --- running ---------------------------------------------------------------------------------

    def start(self, branches: list[Branch]) -> None:
        walk = self.walk
        lone = len(branches) == 1 and not self.running
        bookings: list[tuple[Branch, Booking]] = []
        for branch in branches:
            resumed = branch.state.started
            left = self.left.get(branch.sid)
            adopt = left is not None and self.adoptable(left, branch.state)
            if left is not None and not adopt:
                self.drop_left([branch.sid])  # its state moved on since the walk began: run anew, the row goes
            self.left.pop(branch.sid, None)
            ctx = walk.begin(branch, journal=not adopt)
            for name in (
                "claim",
                "confirm",
                "consume_signal",
                "child",
                "emit",
                "rate_limit",
                "rate_report",
                "lease_check",
            ):
                setattr(ctx, name, self.forward.wrap(getattr(ctx, name)))
            if adopt:
                # A worker runs it (or ran it) for an earlier walk of this run that died: wait for its row.
                branch.fleet, branch.booked_at, self.next_poll = True, time.monotonic(), 0.0
            elif (
                not lone
                and self.for_fleet(branch)
                and not self.quick(branch)  # not worth a trip to another worker
                and len(self.on_fleet()) + len(bookings) < self.fleet_window
            ):
                assert branch.fields is not None
                bookings.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields, resumed, branch.step))
                )
        self.book(bookings)  # with the last outcomes and these step_started: one commit
        self.walked += len(branches)
        for branch in branches:
            if branch.fleet:
                self.running[branch.sid] = branch
        branches = [branch for branch in branches if not branch.fleet]
        if not branches:
            return
        # A lone branch runs on the walk's thread, as a plain list always did; so do branches of a step whose
        # attempts so far took less than handing one to a thread costs (no-op tools): one after another, their
        # outcomes journaled together with the next starts.
        inline = branches if lone else [branch for branch in branches if self.quick(branch)]
        threaded = [] if lone else [branch for branch in branches if not self.quick(branch)]
        if threaded and self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=settings.PAL_WALK_THREADS, thread_name_prefix="pal-branch")
        for branch in threaded:
            self.running[branch.sid] = branch
            assert self.pool is not None
            self.pool.submit(self.body, branch)
        for branch in inline:
            self.running[branch.sid] = branch
            began = time.monotonic()
            try:
                output, error = branch.invoke(), None
            except BaseException as exc:
                output, error = None, exc
            branch.took = time.monotonic() - began
            self.outcome(branch, output, error)

    def quick(self, branch: Branch) -> bool:
        """The attempts of this branch's step so far took less than a thread hand-off costs."""
        took = self.took.get(branch.step["id"])
        return took is not None and took < QUICK_SECONDS

    # --- items on the fleet (runs.branches) ------------------------------------------------------

    def for_fleet(self, branch: Branch) -> bool:
        return self.fleet and branch.step["kind"] in FLEET_KINDS and branch.problem is None

    def book(self, bookings: list[tuple[Branch, Booking]]) -> None:
        """Journal what is pending and book these items for the fleet in one fenced commit; send their tasks
        after it."""
        walk = self.walk
        if not bookings:
            return walk.flush()
        with transaction.atomic():
            leases.fence_check(walk.fence)
            walk.flush()
            sent = items_book(run_id=walk.run.id, bookings=[booking for _, booking in bookings])
            for sid, task_id in sent:
                enqueue_item(run_id=walk.run.id, sid=sid, task_id=task_id)
        walk.items_booked = True
        now = time.monotonic()
        for (branch, _), (_, task_id) in zip(bookings, sent, strict=True):
            branch.fleet, branch.booking, branch.booked_at = True, leases.task_owner(task_id), now
        self.next_poll = now + settings.PAL_ITEM_POLL_SECONDS

    def on_fleet(self) -> list[Branch]:
        return [branch for branch in self.running.values() if branch.fleet]

    def poll(self) -> None:
        """Read the run's item rows: journal the outcomes that came (deleting their rows in that commit), take back
        the bookings no worker took in time, book again an item whose worker died."""
        walk = self.walk
        self.next_poll = time.monotonic() + settings.PAL_ITEM_POLL_SECONDS
        rows = items_of(run_id=walk.run.id)
        came: list[ItemRow] = []
        rebook: list[tuple[Branch, Booking]] = []
        local = sum(1 for branch in self.running.values() if not branch.fleet)
        clock = time.monotonic()
        for branch in self.on_fleet():
            row = rows.get(branch.sid)
            if row is None or row.attempt != branch.state.attempt:
                with transaction.atomic():
                    leases.fence_check(walk.fence)  # a cancel dropped the run's leases, ours too: stop
                rebook.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields or {}, True, branch.step))
                )
            elif row.result is not None:
                if branch.booking:  # a worker took it and is done already: the fleet has room for one more
                    self.fleet_window = min(settings.PAL_WALK_THREADS * 4, self.fleet_window + 1)
                came.append(row)
                self.outcome(branch, *_item_outcome(branch, row.result))
            elif row.booked:
                waited = clock - branch.booked_at >= settings.PAL_ITEM_PICKUP_SECONDS
                if (self.stopping or (waited and local < settings.PAL_WALK_THREADS)) and self.take_back(branch, row):
                    local += 1
                    self.fleet_window = max(1, self.fleet_window // 2)
            elif branch.booking:
                branch.booking = ""  # a worker took it: the fleet has room for one more
                self.fleet_window = min(settings.PAL_WALK_THREADS * 4, self.fleet_window + 1)
            elif not row.live:
                log.warning(
                    "run %s: item %s's worker %s stopped beating; booked again", walk.run.id, row.sid, row.owner
                )
                rebook.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields or {}, True, branch.step))
                )
                # The same attempt again on another worker: journaled as a resumed start, as after a crash.
                walk.journal_start(branch, branch.context().key, resumed=True)
                branch.context().resumed = True  # if it comes back to this walk's threads
        if came:
            with transaction.atomic():
                leases.fence_check(walk.fence)
                walk.flush()
                items_done(run_id=walk.run.id, rows=came)
        if rebook:
            self.book(rebook)

    def take_back(self, branch: Branch, row: ItemRow) -> bool:
        """A booking no worker took: the walk runs it on a thread of its own (or, when its slice is over, leaves it
        started for the next slice). False when a worker took it first."""
        walk = self.walk
        with transaction.atomic():
            leases.fence_check(walk.fence)
            if not item_take_back(run_id=walk.run.id, sid=branch.sid, owner=row.owner):
                return False
        branch.fleet, branch.booking = False, ""
        if self.stopping:
            del self.running[branch.sid]  # it stays started: the next slice resumes it under the same key
            return True
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=settings.PAL_WALK_THREADS, thread_name_prefix="pal-branch")
        self.pool.submit(self.body, branch)
        return True

    def body(self, branch: Branch) -> None:
        """A branch's thread: the step's own code; its outcome goes back to the walk's thread."""
        began = time.monotonic()
        try:
            output = branch.invoke()
        except BaseException as exc:
            branch.took = time.monotonic() - began
            self.forward.inbox.put(("done", branch, None, exc))
        else:
            branch.took = time.monotonic() - began
            self.forward.inbox.put(("done", branch, output, None))

    def outcome(self, branch: Branch, output: Any, error: BaseException | None) -> None:
        del self.running[branch.sid]
        if branch.took:  # how long the step's code took (its worker's figure for an item on the fleet)
            step_id = branch.step["id"]
            seen = self.took.get(step_id)
            self.took[step_id] = branch.took if seen is None else 0.8 * seen + 0.2 * branch.took
        try:
            result = self.walk.settle(branch, output, error)
        except SliceOver:
            self.stopping = True  # a child used up the slice: the others finish their attempts, then the handoff
            branch.state.waiting = True  # its child goes on in the next slice: no second step_started
            return
        state = branch.state
        if result.result is Result.WAITING:
            self.parked[branch.sid] = branch
            if not branch.waits_on_child():
                self.walk.pending += branch.park_events  # journaled with the next commit; a child's at the parking
                branch.park_events = []
            state.waiting = True  # when it goes on, it goes on where it stopped: no second step_started
        elif result.result is Result.RETRY_LATER:
            branch.due, branch.handoff_reason = time.monotonic() + result.delay, "unknown outcome"
            self.later[branch.sid] = branch
        elif result.result is Result.FAILED:
            state.failed_tries += 1
            max_attempts, backoff = step_policy(branch.step)
            if state.failed_tries >= max_attempts:
                self.failed = self.failed or branch
            elif backoff > 0:
                self.walk.next_try(state)
                branch.due, branch.handoff_reason = time.monotonic() + backoff, "backoff"
                self.later[branch.sid] = branch
            else:
                self.walk.next_try(state)

    def next_message(self, timeout: float | None) -> None:
        try:
            message = self.forward.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        if message[0] == "call":
            _, fn, args, kwargs, reply = message
            try:
                reply.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the branch's thread raises it, as a direct call would have
                reply.set_exception(exc)
        else:
            _, branch, output, error = message
            self.outcome(branch, output, error)

    # --- the loop --------------------------------------------------------------------------------

    def run(self):
        walk = self.walk
        while True:
            if self.walked and walk.deadline is not None and time.monotonic() > walk.deadline:
                self.stopping = True
            now = time.monotonic()
            for sid, branch in list(self.later.items()):
                if branch.due <= now and not self.stopping:
                    del self.later[sid]
            ready = [] if self.stopping or self.failed or self.over_budget else self.ready()
            if ready and self.budgeted:
                walk.flush()  # the spend is the journal's: the outcomes so far first
                self.over_budget = budget_reached(walk.run)  # the next step does not start past a cap
                if self.over_budget:
                    ready = []
            if ready:
                self.start(ready)
                continue
            if self.running:
                # A walk that is stopping starts none of its later branches (the next slice does): it waits for
                # what runs, not for their due times, which may have passed (a wait of 0 s: a spin until they end).
                later = () if self.stopping else self.later.values()
                soonest = min((b.due for b in later), default=None)
                if self.on_fleet():
                    soonest = min(soonest or self.next_poll, self.next_poll)
                self.next_message(None if soonest is None else max(0.0, soonest - time.monotonic()))
                if self.on_fleet() and time.monotonic() >= self.next_poll:
                    self.poll()
                continue
            # Nothing runs and nothing more can start now.
            if self.failed is not None:
                failed = self.failed
                return walk.finish_failed(failed.sid, failed.state.attempt, failed.state.failure or {})
            if all(self.done(step["id"]) for step in self.steps):
                return walk.finish_succeeded()
            if self.stopping and not (self.parked and not self.later and not self.ready()):
                return walk.end_slice()
            if self.later:
                first = min(self.later.values(), key=lambda b: b.due)
                delay = round(max(0.0, first.due - time.monotonic()), 3)  # to the millisecond: a countdown
                if not walk.nested:
                    retry_step = first.sid if first.handoff_reason == "backoff" else None
                    return walk.handoff(reason=first.handoff_reason, delay=delay, retry_step=retry_step)
                walk.flush()
                walk.sleep_fenced(delay)
                continue
            if self.over_budget:
                return walk.park_on_budget(self.over_budget)
            if self.parked:
                moved = walk.go_waiting(list(self.parked.values()))
                if not moved:
                    return None
                # The child woke (or ended) between its own parking and ours: do not park on it; drive it on.
                for branch in moved:
                    del self.parked[branch.sid]
                    branch.wait, branch.park_events = None, []
                continue
            raise RuntimeError(f"run {walk.run.id}: no step can run and none waits")  # a bug: the graph is checked


def _item_outcome(branch: Branch, result: dict) -> tuple[Any, BaseException | None]:
    """An item's outcome as its worker wrote it (run_item), as the walk's settle() takes it."""
    if branch.ctx is not None:
        branch.ctx.extra.update(result.get("extra") or {})
    if "ms" in result:  # the item's own time on its worker, not since this walk began (or adopted) it
        branch.began = time.monotonic() - float(result["ms"]) / 1000
        branch.took = float(result["ms"]) / 1000
    if "output" in result:
        return result["output"], None
    if "wait" in result:
        wait = result["wait"]
        wake_at = datetime.fromisoformat(wait["wake_at"]) if wait.get("wake_at") else None
        return None, Wait(wait["waiting_on"], wake_at=wake_at, journal=[tuple(pair) for pair in wait["journal"]])
    error = result.get("error") or {}
    return None, StepError(
        str(error.get("message", "")),
        permanent=bool(error.get("permanent", True)),
        code=str(error.get("code", "step_error")),
        details=error.get("details"),
    )


class ItemWriter(JournalWriter):
    """The journal writer of an item on the worker that took it: the item's own fence (its branch_locks row) in
    place of the walk's; nothing pending (each row goes as it comes), the tail read at each append (the walk
    appends too)."""

    def __init__(self, run: Run, fence: Fence):
        super().__init__(run, fence, writer=f"{fence.owner} {fence.branch}")


def run_item(*, run_id, sid: str, task_id: str) -> str:
    """Run one item of a run's fan-out for the task its walk booked (runs.branches): take it, run the step's code
    under the item's own lease, and write its outcome into its row for the walk to journal."""
    taken = item_take(run_id=run_id, sid=sid, task_id=task_id, owner=f"{leases.worker_id()}:item")
    if taken is None:
        return "gone"  # the walk took it back, a cancel dropped it, or it was booked again for another task
    fence = taken.fence
    leases.heartbeat.track(fence)
    try:
        step = taken.step or _step_of(run_id, sid)
        run = Run(id=fence.run_id)  # what its writes name; the walk made everything else of the step already
        writer = ItemWriter(run, fence)
        key = step_key(run.id, sid, taken.attempt)
        state = StepState(attempt=taken.attempt, started=True)
        ctx = StepCapabilities(writer, step_id=sid, attempt=taken.attempt, key=key, state=state).context(
            run_id=str(run.id),
            resumed=taken.resumed,
            timeout=step.get("timeout_seconds"),
            emit=writer.emit(sid, taken.attempt),
            lease_lost=lambda: leases.heartbeat.lost(fence),
        )
        if ctx.timeout:
            ctx.deadline = time.monotonic() + float(ctx.timeout)
        take_slot = ctx.rate_limit

        def before_try(channel: str, name: str) -> list:
            # Before each try of a send: a worker frozen past its lease, whose item went elsewhere, sends nothing.
            if not item_holds(fence=fence):
                raise LeaseLost(f"item {sid} of run {run_id} is no longer this worker's")
            return take_slot(channel, name)

        ctx.rate_limit = before_try
        result: dict[str, Any]
        began = time.monotonic()
        try:
            output = step_invoke(step, ctx, context={}, fields=taken.fields)
            dumps_json({"output": output}, what=f"what step {sid} returned")  # its row would refuse it
            result = {"output": output, "extra": {**ctx.extra, "ran_on": fence.owner}}  # in its step_completed
        except Wait as exc:
            wake_at = exc.wake_at.isoformat() if exc.wake_at is not None else None
            result = {"wait": {"waiting_on": exc.waiting_on, "wake_at": wake_at, "journal": exc.journal}}
        except StepError as exc:
            result = {"error": exc.as_payload()}
        except NotJSON as exc:
            result = {"error": {"message": str(exc), "code": "internal_error", "permanent": True}}
        except (LeaseLost, FencedOut):
            return "fenced"
        except (Interrupted, DatabaseError) as exc:
            # Not the item's outcome: its lease is no longer beaten, so it expires and the walk books it again.
            log.warning("run %s item %s: the database failed under it; it will be booked again: %s", run_id, sid, exc)
            return "interrupted"
        except Exception as exc:  # a bug in a tool must fail the item, not wedge the run in a loop
            log.error("item %s of run %s raised", sid, run_id, exc_info=exc)
            result = {"error": StepError(f"{type(exc).__name__}: {exc}", code="internal_error").as_payload()}
        result["ms"] = round((time.monotonic() - began) * 1000, 3)
        return "done" if item_finish(fence=fence, result=result) else "fenced"
    except DatabaseError as exc:
        log.warning("run %s item %s: the database failed; its walk will book it again: %s", run_id, sid, exc)
        return "interrupted"
    finally:
        leases.heartbeat.untrack(fence)


def _step_of(run_id, sid: str) -> dict:
    """An item's step from its run's workflow (a booking made before bookings carried it)."""
    run = Run.objects.select_related("workflow").get(id=run_id)
    step_id = sid.rsplit("[", 1)[0]
    return next(step for step in run.workflow.definition["steps"] if step["id"] == step_id)


def _wake_parent_of(child: Run, *, by: str, why: str) -> None:
    """Inside the child's ending (or waking) commit: a parent parked on this child goes on."""
    run_wake(run_id=child.parent_run_id, by=by, why=why, expect={"kind": "child", "child_run_id": str(child.id)})


def _child_status_locked(child_id) -> str | None:
    """The child's status, its row locked until the caller's commit (a wake-up's UPDATE of it waits, and so do
    we for one in flight). SQLite has one writer at a time: there select_for_update is a no-op. A child held back
    by its group's limit, or walked under a live lease of its own, counts as waiting: its ending wakes us."""
    child = Run.objects.select_for_update(no_key=True).filter(id=child_id).only("status", "waiting_on").first()
    if child is None:
        return None
    if held_back(child):
        return RunStatus.WAITING
    if child.status not in FINAL_STATUSES and leases.lease_held_elsewhere(run_id=child_id):
        return RunStatus.WAITING  # walked under its own task: its ending (held up by our lock) wakes us
    return child.status


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
    except (Interrupted, DatabaseError) as exc:
        # Not the run's failure: its lease is no longer beaten (untracked below), so it expires and the sweep
        # re-drives the run once the database answers again.
        log.warning("run %s: the walk stopped on a database error; the sweep will re-drive it: %s", run_id, exc)
        return "interrupted"
    except Exception as exc:  # a bug of ours: counted, so that it cannot have the run re-driven for ever
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

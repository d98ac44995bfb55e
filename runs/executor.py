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
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import transaction
from django.utils import timezone

from journal.models import RESERVED_KINDS
from journal.selectors import replay_rows_for_run
from journal.services import Fence, FencedOut, NewEvent, Tail, events_append, read_tail

from . import leases
from .capabilities import StepCapabilities
from .dispatch import enqueue_drive, enqueue_wake
from .errors import Interrupted, SliceOver
from .models import FINAL_STATUSES, Run, RunStatus, Signal
from .replay import MISSING, StepState, replay, step_key
from .services import run_wake
from .steps.base import LeaseLost, StepError, Wait, outcome_unknown
from .workflows import step_invoke, step_policy

log = logging.getLogger("pal.executor")


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


class Walk:
    def __init__(self, run: Run, fence: Fence, *, nested: bool = False):
        self.run = run
        self.fence = fence
        self.nested = nested  # a child driven inline by its parent's walk: no slicing, no handoff
        self.writer = fence.owner
        self.pending: list[NewEvent] = []
        self.definition = run.workflow.definition
        self.outputs: dict[str, Any] = {}
        self.step_context: dict[str, dict] = {}  # {id: {"output": ...}} for templates, grown as steps finish
        self.tail: Tail | None = None  # the run's last journal row, known from the replay: appends skip reading it
        self.deadline: float | None = None  # the slice's end (a child driven inline shares its root's)

    def remember(self, step_id, output):
        self.outputs[step_id] = output
        self.step_context[step_id] = {"output": output}

    # --- journal ---------------------------------------------------------------------------------

    def flush(self):
        if self.pending:
            events_append(run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, fence=self.fence)
            self.pending = []

    def emit(self, step_id, attempt):
        def emit(kind: str, payload: Any = None) -> int:
            if kind in RESERVED_KINDS:
                raise StepError(f"kind {kind!r} is reserved for the engine", code="reserved_kind")
            self.flush()
            return events_append(
                run_id=self.run.id,
                tail=self.tail,
                events=[NewEvent(kind, step_id, attempt, payload)],
                writer=self.writer,
                fence=self.fence,
            )[0]

        return emit

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

    def go_waiting(self, step_id: str, attempt: int, wait: Wait) -> bool:
        """Park the run: journal why, give up the lease, hold no worker. A timer also sends a wake-up task.

        Parking on a child is conditional on the child still waiting, read under a lock on the child's row: a
        wake-up of the child (which flips the child, then its waiting ancestors) is ordered before or after this
        commit, never in between. False: the child moved first; nothing was written and the caller drives it on."""
        now = timezone.now()
        with transaction.atomic():
            child_id = wait.waiting_on.get("child_run_id") if wait.waiting_on.get("kind") == "child" else None
            if child_id is not None and _child_status_locked(child_id) != RunStatus.WAITING:
                return False
            leases.lease_release(fence=self.fence)
            pending = self.pending + [NewEvent(kind, step_id, attempt, payload) for kind, payload in wait.journal]
            pending.append(NewEvent("run_waiting", step_id, attempt, {"waiting_on": wait.waiting_on}))
            events_append(
                run_id=self.run.id, tail=self.tail, events=pending, writer=self.writer, epoch=self.fence.epoch
            )
            self.pending = []
            self.set_status(RunStatus.WAITING, waiting_on=wait.waiting_on, wake_at=wait.wake_at)
            if wait.wake_at is not None:
                enqueue_wake(run_id=self.run.id, countdown=max(0.0, (wait.wake_at - now).total_seconds()))
        if wait.waiting_on.get("kind") == "signal":
            # A signal sent between our look and this commit found the run not yet waiting: wake it ourselves.
            if Signal.objects.filter(
                run_id=self.run.id, name=wait.waiting_on["name"], consumed_at__isnull=True
            ).exists():
                run_wake(
                    run_id=self.run.id,
                    by="engine",
                    why="a signal arrived while the run was parking",
                    expect={"kind": "signal"},
                )
        return True

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
            leases.lease_release(fence=self.fence)
            return
        # The replay's read gives the tail, so run_started chains without reading it (replay skips run_started).
        rows = replay_rows_for_run(run_id=run.id)
        self.tail = Tail(rows[-1].seq, rows[-1].hash) if rows else Tail()
        if run.status == RunStatus.QUEUED:
            with transaction.atomic():
                events_append(
                    run_id=run.id,
                    tail=self.tail,
                    events=[NewEvent("run_started", payload={"worker": self.writer})],
                    writer=self.writer,
                    fence=self.fence,
                )
                self.set_status(RunStatus.RUNNING, expect=RunStatus.QUEUED, started_at=timezone.now())
        states = replay(rows)
        if self.deadline is None:
            self.deadline = time.monotonic() + settings.PAL_SLICE_SECONDS
        walked = 0
        for step in self.definition["steps"]:
            step_id = step["id"]
            state = states.setdefault(step_id, StepState())
            if state.output is not MISSING:
                self.remember(step_id, state.output)
                continue
            max_attempts, backoff = step_policy(step)
            if state.failure is not None:
                if state.failed_tries >= max_attempts:
                    return self.finish_failed(step_id, state.attempt, state.failure)
                self.next_try(state)
            if walked and time.monotonic() > self.deadline:
                return self.end_slice()
            while True:
                try:
                    outcome = self.attempt(step, state)
                except SliceOver:  # a child driven inline used up the slice: the whole tree goes back to the queue
                    return self.end_slice()
                walked += 1
                if outcome.result is Result.WAITING:
                    return
                if outcome.result is Result.RETRY_LATER:
                    if not self.nested:
                        return self.handoff(reason="unknown outcome", delay=outcome.delay)
                    self.flush()
                    self.sleep_fenced(outcome.delay)
                    continue
                if outcome.result is Result.DONE:
                    break
                # The attempt failed and was journaled as step_failed (pending).
                state.failed_tries += 1
                if state.failed_tries >= max_attempts:
                    return self.finish_failed(step_id, state.attempt, state.failure or {})
                if backoff > 0 and not self.nested:
                    return self.handoff(reason="backoff", delay=backoff, retry_step=step_id)
                if backoff > 0:
                    self.sleep_fenced(backoff)
                self.next_try(state)
        self.finish_succeeded()

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

    def attempt(self, step: dict, state: StepState) -> Outcome:
        """Run one attempt of the step; what it came to is journaled (pending) and returned."""
        step_id, attempt = step["id"], state.attempt
        key = step_key(self.run.id, step_id, attempt)
        resumed = state.started
        # A resumed attempt (started before a crash) is journaled again with resumed=true, so the waterfall
        # shows when it really ran; the attempt and its key stay the same.
        if not state.waiting:  # a step woken from its wait goes on; it did not start again
            payload = {"key": key, "kind": step["kind"]}
            if resumed:
                payload["resumed"] = True
            self.pending.append(NewEvent("step_started", step_id, attempt, payload))
        state.started = True
        self.flush()  # the previous step's step_completed and this step_started: one commit
        started = time.monotonic()
        ctx = StepCapabilities(self, step_id=step_id, attempt=attempt, key=key, state=state).context(
            run_id=str(self.run.id),
            resumed=resumed,
            timeout=step.get("timeout_seconds"),
            emit=self.emit(step_id, attempt),
            lease_lost=lambda: leases.heartbeat.lost(self.fence),
        )
        if ctx.timeout:
            ctx.deadline = started + float(ctx.timeout)
        try:
            output = step_invoke(step, ctx, context={"input": self.run.input, "steps": self.step_context})
        except (LeaseLost, FencedOut):
            raise FencedOut(self.fence) from None
        except (SliceOver, Interrupted):
            raise
        except DatabaseError as exc:
            # Our own store failed under the step (a claim, a confirm, a signal, a child): that says nothing about
            # the step, so no step_failed. The walk stops; the lease expires and the sweep re-drives the run.
            raise Interrupted(f"the database failed during step {step_id} of run {self.run.id}: {exc}") from exc
        except Wait as wait:
            if self.go_waiting(step_id, attempt, wait):
                return WAITING
            # The child woke (or ended) between its own parking and ours: do not park on it; drive it on.
            state.waiting = True  # the attempt goes on: no second step_started, no adoption
            return self.attempt(step, state)
        except StepError as exc:
            failure = exc.as_payload()
            if not exc.permanent and state.unknown_tries < settings.PAL_UNKNOWN_RETRIES:
                # An outcome we do not know (a timeout, a connection lost after sending): not a step_failed.
                # The same attempt runs again later with the same key, so the peer can dedup it.
                state.unknown_tries += 1
                delay = min(2.0**state.unknown_tries, 60.0)
                self.pending.append(
                    NewEvent(
                        "step_retrying",
                        step_id,
                        attempt,
                        {**failure, "try": state.unknown_tries, "retry_in_seconds": delay},
                    )
                )
                return Outcome(Result.RETRY_LATER, delay)
        except Exception as exc:  # a bug in a tool must fail the step, not wedge the run in a loop of crashes
            log.exception("step %s of run %s raised", step_id, self.run.id)
            failure = {"message": f"{type(exc).__name__}: {exc}", "code": "internal_error", "permanent": True}
        else:
            ms = round((time.monotonic() - started) * 1000, 3)
            self.pending.append(NewEvent("step_completed", step_id, attempt, {**ctx.extra, "output": output, "ms": ms}))
            self.remember(step_id, output)
            state.output = output
            return DONE
        failure["ms"] = round((time.monotonic() - started) * 1000, 3)
        self.pending.append(NewEvent("step_failed", step_id, attempt, failure))
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
            if self.pending:
                events_append(
                    run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch
                )
            self.pending = []
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
            leases.lease_release(fence=self.fence)
            if self.pending:
                events_append(
                    run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch
                )
            self.pending = []
        raise SliceOver()

    def finish_succeeded(self):
        output = self.outputs.get(self.definition["steps"][-1]["id"])
        self.finish(
            RunStatus.SUCCEEDED, NewEvent("run_succeeded", payload={"output": output}), output=output, error=None
        )

    def finish_failed(self, step_id: str, attempt: int, failure: dict):
        error = {"step_id": step_id, "attempt": attempt, **{k: v for k, v in failure.items() if k != "ms"}}
        self.finish(RunStatus.FAILED, NewEvent("run_failed", step_id, attempt, {"error": error}), error=error)

    def finish(self, status: str, event: NewEvent, **fields):
        """End the run in one commit: release the lease, journal the ending, record the journal's head. A child
        that ends outside its parent's walk (an operator re-drove it) moves a parent that waits on it."""
        now = timezone.now()
        with transaction.atomic():
            leases.lease_release(fence=self.fence)
            self.pending.append(event)
            events_append(
                run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch
            )
            self.pending = []
            head = self.head()
            self.set_status(
                status,
                finished_at=now,
                waiting_on=None,
                journal_head_seq=head.seq,
                journal_head_hash=head.hash,
                **fields,
            )
            if self.run.parent_run_id and not self.nested:
                _wake_parent_of(self.run, by=self.writer, why=f"child {self.run.id} ended {status}")


def _wake_parent_of(child: Run, *, by: str, why: str) -> None:
    """Inside the child's ending (or waking) commit: a parent parked on this child goes on."""
    run_wake(run_id=child.parent_run_id, by=by, why=why, expect={"kind": "child", "child_run_id": str(child.id)})


def _child_status_locked(child_id) -> str | None:
    """The child's status, its row locked until the caller's commit (a wake-up's UPDATE of it waits, and so do
    we for one in flight). SQLite has one writer at a time: there select_for_update is a no-op."""
    return Run.objects.select_for_update(no_key=True).filter(id=child_id).values_list("status", flat=True).first()


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
        Walk(run, fence).go()
    except FencedOut as exc:
        log.warning("run %s: %s; stopping without writing", run_id, exc)
        return "fenced"
    except (Interrupted, DatabaseError) as exc:
        # Not the run's failure: its lease is no longer beaten (untracked below), so it expires and the sweep
        # re-drives the run once the database answers again.
        log.warning("run %s: the walk stopped on a database error; the sweep will re-drive it: %s", run_id, exc)
        return "interrupted"
    finally:
        leases.heartbeat.untrack(fence)
    return "walked"

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

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from journal.models import RESERVED_KINDS
from journal.selectors import event_rows_for_run
from journal.services import Fence, FencedOut, NewEvent, Tail, events_append, read_tail

from . import leases
from .models import FINAL_STATUSES, Run, RunStatus, SideEffect, SideEffectStatus, Signal, Workflow
from .steps.base import LeaseLost, StepContext, StepError, Wait, get_kind
from .workflows import COMMON_FIELDS, render, step_policy

log = logging.getLogger("pal.executor")
MISSING = object()
WAITING = object()


@dataclass
class RetryLater:
    delay: float


def step_key(run_id, step_id: str, attempt: int) -> str:
    return f"{run_id}:{step_id}:{attempt}"


@dataclass
class StepState:
    attempt: int = 1
    started: bool = False  # the current attempt has a step_started
    output: Any = MISSING  # the current attempt's step_completed output
    failure: dict | None = None  # the current attempt's step_failed payload
    waiting: bool = False  # the current attempt parked the run (run_waiting) and has not started again since
    unknown_tries: int = 0  # step_retrying events of the current attempt: outcomes we could not know
    events: dict = field(default_factory=dict)  # the current attempt's last payload of each other kind


# Kinds a step reads back on replay (an approval's decision, a consumed signal, a timer's deadline ...).
REMEMBERED = {"approval_requested", "approval_decided", "signal_received", "run_waiting", "child_created", "child_adopted"}


def replay(rows) -> dict[str, StepState]:
    """Fold the journal into each step's current attempt and outcome."""
    states: dict[str, StepState] = {}
    for _seq, kind, step_id, attempt, payload, _created, *_ in rows:
        if step_id is None:
            continue
        state = states.setdefault(step_id, StepState())
        if kind == "step_started":
            if attempt != state.attempt or state.failure is not None:
                state.output, state.failure, state.events, state.unknown_tries = MISSING, None, {}, 0
            state.attempt, state.started, state.waiting = attempt, True, False
        elif kind == "step_retrying" and attempt == state.attempt:
            state.unknown_tries += 1
        elif kind in REMEMBERED and attempt == state.attempt:
            state.events[kind] = payload or {}
            if kind == "run_waiting":
                state.waiting = True
        elif kind == "step_completed" and attempt == state.attempt:
            state.output = (payload or {}).get("output")
        elif kind == "step_failed" and attempt == state.attempt:
            state.failure = payload or {}
        elif kind == "run_retried":
            # An operator's retry: the failed step goes on with attempt + 1 (new key).
            state.attempt, state.started, state.output, state.failure = (attempt or state.attempt + 1), False, MISSING, None
            state.events, state.waiting = {}, False
    return states


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
            return events_append(run_id=self.run.id, tail=self.tail, events=[NewEvent(kind, step_id, attempt, payload)], writer=self.writer, fence=self.fence
            )[0]

        return emit

    # --- side effects (deliver) ------------------------------------------------------------------

    def claimer(self, step_id: str, attempt: int, key: str):
        def claim(*, channel: str, target: str) -> tuple[SideEffect, bool]:
            """Take the key before sending. Returns (row, True) for a new claim, (row, False) for an old one."""
            self.flush()
            with transaction.atomic():
                leases.fence_check(self.fence)
                effect, created = SideEffect.objects.get_or_create(
                    key=key,
                    defaults=dict(
                        run_id=self.run.id, step_id=step_id, attempt=attempt, channel=channel, target=target,
                        claimed_epoch=self.fence.epoch, claimed_at=timezone.now(),
                    ),
                )
                if created:
                    events_append(run_id=self.run.id, tail=self.tail,
                        events=[NewEvent("side_effect_claimed", step_id, attempt, {"key": key, "channel": channel, "target": target})],
                        writer=self.writer,
                        fence=self.fence,
                    )
            return effect, created

        return claim

    def confirmer(self, step_id: str, attempt: int):
        def confirm(effect: SideEffect, *, status: str, response: Any = None):
            with transaction.atomic():
                leases.fence_check(self.fence)
                effect.status = status
                effect.response = response
                if status == SideEffectStatus.DELIVERED:
                    effect.delivered_at = timezone.now()
                effect.save(update_fields=["status", "response", "delivered_at", "updated_at"])
                kind = {"delivered": "side_effect_delivered", "unconfirmed": "side_effect_unconfirmed"}.get(status, "side_effect_failed")
                events_append(run_id=self.run.id, tail=self.tail,
                    events=[NewEvent(kind, step_id, attempt, {"key": effect.key, "channel": effect.channel, "status": status, "response": response})],
                    writer=self.writer,
                    fence=self.fence,
                )

        return confirm

    # --- child runs ------------------------------------------------------------------------------

    def child_runner(self, step_id: str, attempt: int, ctx: StepContext, state: StepState):
        def run_child(*, workflow: str, input: dict):
            """Create (or, after a crash, adopt) the child of this step attempt and drive it inline."""
            self.flush()
            child = (
                Run.objects.select_related("workflow")
                .filter(parent_run_id=self.run.id, parent_step_id=step_id, parent_attempt=attempt)
                .first()
            )
            if child is None:
                child = self.create_child(step_id, attempt, workflow, input)
            elif not state.waiting:  # a crash left the child without our step_completed: adopt it
                events_append(run_id=self.run.id, tail=self.tail,
                    events=[NewEvent("child_adopted", step_id, attempt, {"child_run_id": str(child.id), "status": child.status})],
                    writer=self.writer, fence=self.fence,
                )
            ctx.extra["child_run_id"] = str(child.id)
            if child.status not in FINAL_STATUSES:
                child_fence = leases.lease_take(run_id=child.id)
                try:
                    Walk(child, child_fence, nested=True).go()
                except FencedOut:
                    # The child's walk lost its lease: if the child was cancelled (or ended) on its own, that is
                    # this step's outcome; otherwise someone took the child from us and we stop too.
                    child.refresh_from_db()
                    if child.status not in FINAL_STATUSES:
                        raise
                finally:
                    leases.heartbeat.untrack(child_fence)
                child.refresh_from_db()
            if child.status == RunStatus.SUCCEEDED:
                return child.output
            if child.status == RunStatus.WAITING:
                # The child parked (an approval, a signal, a timer, its own child): so does this run, and waking
                # the child wakes this run too (runs.services.run_wake walks up the tree).
                raise Wait({"kind": "child", "step_id": step_id, "attempt": attempt, "child_run_id": str(child.id),
                            "child_waiting_on": child.waiting_on})
            if child.status in (RunStatus.RUNNING, RunStatus.QUEUED):
                raise FencedOut(self.fence)  # the child's walk was fenced out; so are we
            error = child.error or {}
            raise StepError(
                f"child run {child.id} ({child.workflow.name}) ended {child.status}"
                + (f": {error.get('message')}" if error.get("message") else ""),
                code=f"child_{child.status}",
                # Only the child's own code and message: a grandchild's error is one click further down.
                details={"child_run_id": str(child.id), "error": {k: error.get(k) for k in ("code", "message", "step_id")}},
            )

        return run_child

    def create_child(self, step_id: str, attempt: int, workflow_name: str, input: dict) -> Run:
        # Depth comes from the database (the parent's row), never from a context value that a replay resets.
        depth = self.run.depth + 1
        limit = settings.PAL_MAX_CHILD_DEPTH
        if depth > limit:
            raise StepError(
                f"a child run here would be at depth {depth}; the limit is PAL_MAX_CHILD_DEPTH={limit}",
                code="max_child_depth", details={"depth": depth, "limit": limit},
            )
        workflow = Workflow.objects.filter(name=workflow_name).order_by("-version").first()
        if workflow is None:
            raise StepError(f"child workflow {workflow_name!r} does not exist", code="workflow_not_found")
        now = timezone.now()
        meta = {"parent_run_id": str(self.run.id), "parent_step_id": step_id, "attempt": attempt}
        with transaction.atomic():
            leases.fence_check(self.fence)
            # Created running, not queued: neither the queue nor the sweep can claim it while we drive it.
            child = Run.objects.create(
                workflow=workflow, input=input, status=RunStatus.RUNNING, started_at=now, parent_run=self.run,
                parent_step_id=step_id, parent_attempt=attempt, depth=depth, trigger_meta=meta,
                created_by=f"run {self.run.id}",
            )
            events_append(
                run_id=child.id,
                tail=Tail(),  # created just now: no rows, no need to read its tail before chaining
                events=[
                    NewEvent("run_created", payload={"workflow": workflow.name, "version": workflow.version, "input": input,
                                                     "by": self.writer, **meta, "depth": depth}),
                    NewEvent("run_started", payload={"worker": self.writer, "driven_by_parent": True}),
                ],
                writer=self.writer,
            )
            events_append(run_id=self.run.id, tail=self.tail,
                events=[NewEvent("child_created", step_id, attempt, {"child_run_id": str(child.id), "workflow": workflow.name,
                                                                     "version": workflow.version, "depth": depth})],
                writer=self.writer, fence=self.fence,
            )
        return Run.objects.select_related("workflow").get(id=child.id)

    # --- waiting ---------------------------------------------------------------------------------

    def signal_consumer(self, step_id: str, attempt: int, state: StepState):
        def consume(name: str) -> tuple[bool, Any]:
            """Take the oldest unconsumed signal of this name, exactly once, journaled in the same commit."""
            self.flush()
            with transaction.atomic():
                leases.fence_check(self.fence)
                signal = Signal.objects.filter(run_id=self.run.id, name=name, consumed_at__isnull=True).first()
                if signal is None:
                    return False, None
                taken = Signal.objects.filter(id=signal.id, consumed_at__isnull=True).update(
                    consumed_at=timezone.now(), consumed_step_id=step_id)
                if taken != 1:
                    return False, None
                payload = {"name": name, "payload": signal.payload, "signal_id": signal.id, "sent_by": signal.sent_by}
                events_append(run_id=self.run.id, tail=self.tail, events=[NewEvent("signal_received", step_id, attempt, payload)],
                              writer=self.writer, fence=self.fence)
            state.events["signal_received"] = payload
            return True, signal.payload

        return consume

    def go_waiting(self, step_id: str, attempt: int, wait: Wait):
        """Park the run: journal why, give up the lease, hold no worker. A timer also sends a wake-up task."""
        from .tasks import enqueue_wake

        now = timezone.now()
        with transaction.atomic():
            leases.lease_release(fence=self.fence)
            self.pending += [NewEvent(kind, step_id, attempt, payload) for kind, payload in wait.journal]
            self.pending.append(NewEvent("run_waiting", step_id, attempt, {"waiting_on": wait.waiting_on}))
            events_append(run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch)
            self.pending = []
            Run.objects.filter(id=self.run.id).update(
                status=RunStatus.WAITING, waiting_on=wait.waiting_on, wake_at=wait.wake_at, updated_at=now)
            if wait.wake_at is not None:
                enqueue_wake(run_id=self.run.id, countdown=max(0.0, (wait.wake_at - now).total_seconds()))
        if wait.waiting_on.get("kind") == "signal":
            # A signal sent between our look and this commit found the run not yet waiting: wake it ourselves.
            from .services import run_wake

            if Signal.objects.filter(run_id=self.run.id, name=wait.waiting_on["name"], consumed_at__isnull=True).exists():
                run_wake(run_id=self.run.id, by="engine", why="a signal arrived while the run was parking",
                         expect={"kind": "signal"})

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
        rows = event_rows_for_run(run_id=run.id)
        self.tail = Tail(rows[-1][0], rows[-1][6]) if rows else Tail()
        if run.status == RunStatus.QUEUED:
            with transaction.atomic():
                events_append(
                    run_id=run.id, tail=self.tail, events=[NewEvent("run_started", payload={"worker": self.writer})],
                    writer=self.writer, fence=self.fence,
                )
                Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING, started_at=timezone.now(), updated_at=timezone.now())
        states = replay(rows)
        deadline = time.monotonic() + settings.PAL_SLICE_SECONDS
        walked = 0
        for step in self.definition["steps"]:
            step_id = step["id"]
            state = states.setdefault(step_id, StepState())
            if state.output is not MISSING:
                self.remember(step_id, state.output)
                continue
            max_attempts, backoff = step_policy(step)
            if state.failure is not None:
                if state.attempt >= max_attempts:
                    return self.finish_failed(step_id, state.attempt, state.failure, already_journaled=True)
                state.attempt, state.started, state.failure = state.attempt + 1, False, None
            if walked and not self.nested and time.monotonic() > deadline:
                return self.handoff(reason="slice")
            while True:
                outcome = self.attempt(step, state)
                walked += 1
                if outcome is WAITING:
                    return
                if isinstance(outcome, RetryLater):
                    if not self.nested:
                        return self.handoff(reason="unknown outcome", delay=outcome.delay)
                    self.flush()
                    self.sleep_fenced(outcome.delay)
                    continue
                if outcome is not None:
                    break
                # The attempt failed and was journaled as step_failed (pending).
                if state.attempt >= max_attempts:
                    return self.finish_failed(step_id, state.attempt, state.failure)
                if backoff > 0 and not self.nested:
                    return self.handoff(reason="backoff", delay=backoff, retry_step=step_id)
                if backoff > 0:
                    self.sleep_fenced(backoff)
                state.attempt, state.started, state.failure = state.attempt + 1, False, None
        self.finish_succeeded()

    def attempt(self, step: dict, state: StepState):
        """Run one attempt. Returns True on success (output stored), None on a definite failure."""
        step_id, attempt = step["id"], state.attempt
        key = step_key(self.run.id, step_id, attempt)
        kind = get_kind(step["kind"])
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
        ctx = StepContext(
            run_id=str(self.run.id),
            step_id=step_id,
            attempt=attempt,
            key=key,
            resumed=resumed,
            timeout=step.get("timeout_seconds"),
            emit=self.emit(step_id, attempt),
            lease_lost=lambda: leases.heartbeat.lost(self.fence),
            claim=self.claimer(step_id, attempt, key),
            confirm=self.confirmer(step_id, attempt),
        )
        if ctx.timeout:
            ctx.deadline = started + float(ctx.timeout)
        ctx.find = state.events.get
        ctx.consume_signal = self.signal_consumer(step_id, attempt, state)
        ctx.child = self.child_runner(step_id, attempt, ctx, state)
        try:
            if kind is None:
                raise StepError(f"unknown kind {step['kind']!r}", code="unknown_kind")
            context = {"input": self.run.input, "steps": self.step_context}
            fields = {k: (render(v, context, field=k) if k in kind.templated else v) for k, v in step.items() if k not in COMMON_FIELDS}
            output = kind.run(fields, ctx)
        except (LeaseLost, FencedOut):
            raise FencedOut(self.fence)
        except Wait as wait:
            self.go_waiting(step_id, attempt, wait)
            return WAITING
        except StepError as exc:
            failure = exc.as_payload()
            if not exc.permanent and state.unknown_tries < settings.PAL_UNKNOWN_RETRIES:
                # An outcome we do not know (a timeout, a connection lost after sending): not a step_failed.
                # The same attempt runs again later with the same key, so the peer can dedup it.
                state.unknown_tries += 1
                delay = min(2.0 ** state.unknown_tries, 60.0)
                self.pending.append(NewEvent("step_retrying", step_id, attempt, {
                    **failure, "try": state.unknown_tries, "retry_in_seconds": delay}))
                return RetryLater(delay)
        except Exception as exc:  # a bug in a tool must fail the step, not wedge the run in a loop of crashes
            log.exception("step %s of run %s raised", step_id, self.run.id)
            failure = {"message": f"{type(exc).__name__}: {exc}", "code": "internal_error", "permanent": True}
        else:
            ms = round((time.monotonic() - started) * 1000, 3)
            self.pending.append(NewEvent("step_completed", step_id, attempt, {**ctx.extra, "output": output, "ms": ms}))
            self.remember(step_id, output)
            state.output = output
            return True
        failure["ms"] = round((time.monotonic() - started) * 1000, 3)
        self.pending.append(NewEvent("step_failed", step_id, attempt, failure))
        state.failure = failure
        return None

    # --- endings ---------------------------------------------------------------------------------

    def handoff(self, *, reason: str, delay: float = 0.0, retry_step: str | None = None):
        """Give the run back to the queue: the lease goes to a new task id, sent after commit."""
        from .tasks import enqueue_drive

        task_id = str(uuid.uuid4())
        with transaction.atomic():
            new_fence = leases.lease_handoff(fence=self.fence, task_id=task_id, delay=delay)
            if reason == "backoff":
                self.pending.append(NewEvent("run_backoff", retry_step, None, {"seconds": delay, "until": (timezone.now() + timedelta(seconds=delay)).isoformat()}))
            if self.pending:
                events_append(run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch)
            self.pending = []
            enqueue_drive(run_id=self.run.id, task_id=task_id, countdown=delay)
        log.debug("run %s handed off (%s) to task %s epoch %s", self.run.id, reason, task_id, new_fence.epoch)

    def head(self) -> Tail:
        """The journal's last row after our append (events_append moved self.tail to it), recorded on the run
        row in the same commit as the run's ending so that verification sees rows cut off the end."""
        return self.tail if self.tail is not None else read_tail(self.run.id)

    def finish_succeeded(self):
        output = self.outputs.get(self.definition["steps"][-1]["id"])
        now = timezone.now()
        with transaction.atomic():
            leases.lease_release(fence=self.fence)
            self.pending.append(NewEvent("run_succeeded", payload={"output": output}))
            events_append(run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch)
            self.pending = []
            head = self.head()
            Run.objects.filter(id=self.run.id).update(
                status=RunStatus.SUCCEEDED, output=output, error=None, finished_at=now, updated_at=now, waiting_on=None,
                journal_head_seq=head.seq, journal_head_hash=head.hash,
            )

    def finish_failed(self, step_id: str, attempt: int, failure: dict, already_journaled: bool = False):
        error = {"step_id": step_id, "attempt": attempt, **{k: v for k, v in failure.items() if k != "ms"}}
        now = timezone.now()
        with transaction.atomic():
            leases.lease_release(fence=self.fence)
            self.pending.append(NewEvent("run_failed", step_id, attempt, {"error": error}))
            events_append(run_id=self.run.id, tail=self.tail, events=self.pending, writer=self.writer, epoch=self.fence.epoch)
            self.pending = []
            head = self.head()
            Run.objects.filter(id=self.run.id).update(
                status=RunStatus.FAILED, error=error, finished_at=now, updated_at=now, waiting_on=None,
                journal_head_seq=head.seq, journal_head_hash=head.hash,
            )


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
    finally:
        leases.heartbeat.untrack(fence)
    return "walked"

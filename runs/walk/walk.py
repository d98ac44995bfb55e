"""The walk of one run: its steps' attempts journaled before and after they act, its waits, hand-offs and end.

The only writer of a run's execution status; every write fenced by the lease epoch (FencedOut when it is lost)."""

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import transaction
from django.utils import timezone

from journal.selectors import events_of_kind, replay_rows_for_run
from journal.services import Fence, FencedOut, NewEvent, NotJSON, Tail, dumps_json, read_tail
from pal import telemetry
from pal.clock import db_now

from .. import attributes, leases
from ..code import code_workflow, is_code
from ..concurrency import held_back, slot_hand_over, slot_take
from ..dispatch import enqueue_drive, enqueue_wake
from ..errors import Interrupted, LeaseLost, SliceOver, StepError, Wait, outcome_unknown
from ..models import FINAL_STATUSES, Pause, Run, RunStatus, Signal
from ..pauses import journal_payload, pause_holding, pause_holds, wait_of
from ..replay import MISSING, StepState, replay, step_key
from ..secrets import redact
from ..services import run_wake
from ..steps.base import TASK_WORKFLOW_RE, StepContext
from ..steps.django_task import task_run_ended
from ..workflows import literal_fields, output_of, step_fields
from .branch import DONE, FAILED, OUTCOME_WORDS, WAITING, Branch, Outcome, Result
from .capabilities import StepCapabilities
from .code import CodeGraph
from .scheduler import Graph
from .writer import JournalWriter

log = logging.getLogger("pal.executor")


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
        self.items_booked = False  # this walk booked items for the fleet (runs.walk.fleet): their rows go at its end
        self.code = code_workflow(run.workflow.name) if is_code(self.definition) else None  # Python's
        self.attributes_read = attributes.reads_steps(self.definition)  # the steps whose end sets an attribute

    def remember(self, step_id, output, *, ended: bool = True):
        """A step's output for the templates after it. ended: it ended in this walk (not in the replay), so the
        attributes that read it are set, with its rows (JournalWriter.attributes)."""
        self.outputs[step_id] = output
        self.step_context[step_id] = {"output": output}
        if ended and step_id in self.attributes_read:
            self.attributes.update(attributes.values_after_step(self.definition, step_id, self.context()))

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
        when there are several (a wake-up matches any of them: runs.services.run_wake)."""
        # Parking on a child is conditional on the child still waiting, read under a lock on the child's row: a
        # wake-up of the child (which flips the child, then its waiting ancestors) is ordered before or after this
        # commit, never in between. Returns the branches whose child moved first: then nothing was written and the
        # caller drives them on.
        with transaction.atomic():
            # A paused peer resumed since its step looked: its call goes on. The pauses' rows are locked first (a
            # resume locks its pause's row, then the held runs' rows to set their turns): never a child's before.
            moved = [
                branch
                for branch in parked
                if branch.wait_on.get("kind") == "paused" and not pause_holds(branch.wait_on["pause"])
            ]
            moved += [
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

    def park(self, waiting_on: dict) -> None:
        """Park the run on what an operator must mend (a reached budget, a Python workflow's code that diverged
        from its journal or is not loaded here): nothing more starts until the cap is raised or the run re-driven."""
        with transaction.atomic():
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            # The status before the journal, the order every writer of both uses (Walk.finish, go_waiting, a
            # decision taken in the walk): a decision holding the run's row never waits on our journal row.
            self.set_status(RunStatus.WAITING, waiting_on=waiting_on, wake_at=None)
            slot_hand_over(self.run.concurrency_key)
            self.commit([NewEvent("run_waiting", None, None, {"waiting_on": waiting_on})])

    def park_paused(self, pause: Pause) -> bool:
        """Park the run on an operator's pause of it, its workflow or the fleet, journaled run_paused: no lease, no
        worker, until the resume wakes it. False (nothing written) when the pause was resumed since the look."""
        waiting_on = wait_of(pause)
        with transaction.atomic():
            if not pause_holds(pause.id):  # its row locked FOR SHARE: a resume waits for this commit
                return False
            leases.lease_release(fence=self.fence, branches=self.items_booked)
            self.set_status(RunStatus.WAITING, waiting_on=waiting_on, wake_at=None)
            slot_hand_over(self.run.concurrency_key)
            self.commit(
                [
                    NewEvent("run_paused", None, None, journal_payload(pause)),
                    NewEvent("run_waiting", None, None, {"waiting_on": waiting_on}),
                ]
            )
        return True

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
        # One indexed look a slice (runs.pauses): a pause of the run, its workflow or the fleet parks it here.
        pause = pause_holding(run)
        if pause is not None and self.park_paused(pause):
            return None
        if is_code(self.definition) and self.code is None:
            return self.park({"kind": "code_missing", "code": self.definition["code"]})
        graph = Graph(self, replay(rows)) if self.code is None else CodeGraph(self, replay(rows), self.code)
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
            if self.code is not None:  # a Python workflow's: as its code gave them
                branch.fields = literal_fields(branch.step, branch.item)
            else:
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
            enqueue_drive(run_id=self.run.id, task_id=task_id, countdown=delay, priority=self.run.priority)
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

    def finish_succeeded(self, output: Any = MISSING):
        """The run's output: a Python workflow's return value (output), else its definition's (runs.workflows)."""
        try:
            if output is MISSING:
                output = output_of(self.definition, self.context())
            dumps_json(output, what="the run's output")
        except StepError as exc:  # the workflow's output reads what is not there (a skipped step's field)
            return self.finish_failed(None, None, exc.as_payload())
        except NotJSON as exc:
            return self.finish_failed(None, None, StepError(str(exc), code="output_not_json").as_payload())
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
            if TASK_WORKFLOW_RE.match(self.run.workflow.name):  # django.tasks' task_finished, once: after this commit
                run_id = self.run.id
                transaction.on_commit(lambda: task_run_ended(run_id=run_id))


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

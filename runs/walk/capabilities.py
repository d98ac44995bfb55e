"""What a step may do besides compute, handed to it on its StepContext by the walk: claim a side effect before
sending it and confirm it after, consume a signal, run a child run. Each one writes through the walk's (or the
item's) JournalWriter, after what it has pending and under its fence, so a writer that lost its lease writes
nothing (docs/reference/design.md).
"""

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from journal.selectors import loop_rows
from journal.services import FencedOut, NewEvent

from .. import leases
from ..budgets import budget_reached, has_budget
from ..concurrency import held_back
from ..errors import NotFound, StepError, Wait
from ..models import FINAL_STATUSES, Run, RunStatus, SideEffect, SideEffectStatus, Signal
from ..pauses import dependency_hold, dependency_of, journal_payload, pace_take, wait_of
from ..rate_limits import rate_report, rate_take
from ..replay import StepState
from ..secrets import mask
from ..services import run_create_child, workflow_get
from ..steps.base import StepContext
from ..steps.llm_loop import LoopJournal
from .writer import JournalWriter

LOOP_CALL = re.compile(r"\[(?P<index>[0-9]{1,3}\.[0-9]{1,4})\]")  # a tool call's item, after its step's id
CONFIRMED_KINDS = {"delivered": "side_effect_delivered", "unconfirmed": "side_effect_unconfirmed"}


class StepCapabilities:
    """The capabilities of one step attempt: its writer (the walk's, or an item's on another worker), and
    drive_child, how the walk runs a child inline (None where there is no walk to run it: a fleet item)."""

    def __init__(
        self,
        walk: JournalWriter,
        *,
        step_id: str,
        attempt: int,
        key: str,
        state: StepState,
        drive_child: Callable[..., None] | None = None,
    ):
        self.walk, self.step_id, self.attempt, self.key, self.state = walk, step_id, attempt, key, state
        self.drive_child = drive_child
        self.extra: dict = {}  # merged into the step_completed payload (the child's id)

    def context(self, **fields) -> StepContext:
        """The step's context with these capabilities on it (fields: the rest of StepContext's)."""
        return StepContext(
            step_id=self.step_id,
            attempt=self.attempt,
            key=self.key,
            claim=self.claim,
            confirm=self.confirm,
            consume_signal=self.consume_signal,
            child=self.run_child,
            find=self.state.events.get,
            extra=self.extra,
            rate_limit=self.rate_limit,
            rate_report=rate_report,
            lease_check=self.lease_check,
            loop_read=self.loop_read,
            loop_write=self.loop_write,
            loop_emit=self.loop_emit,
            budget_check=self.budget_check,
            open_request=self.open_request,
            **fields,
        )

    def lease_check(self) -> None:
        """The walk's (or the item's) lease as the database has it: FencedOut when it was cancelled or taken."""
        with transaction.atomic():
            leases.fence_check(self.walk.fence)

    def _append(self, kind: str, payload: Any) -> None:
        self.walk.append([NewEvent(kind, self.step_id, self.attempt, payload)])

    # --- the agent loop of an llm_call with tools (runs.steps.llm_loop) --------------------------------

    def loop_read(self) -> LoopJournal:
        """What this attempt's journal holds of its loop: its turns, its tool calls' starts, outcomes, decisions."""
        self.walk.flush()
        journal = LoopJournal()
        for kind, sid, payload in loop_rows(run_id=self.walk.run.id, step_id=self.step_id, attempt=self.attempt):
            payload = payload if isinstance(payload, dict) else {}
            if sid == self.step_id:
                if kind == "llm_turn" and isinstance(payload.get("turn"), int):
                    journal.turns[payload["turn"]] = payload
                elif kind == "approval_requested" and isinstance(payload.get("call"), str):
                    journal.requested.add(payload["call"][len(self.step_id) + 1 : -1])
                continue
            index = LOOP_CALL.fullmatch((sid or "")[len(self.step_id) :])
            if index is None:
                continue  # an item of a for_each step named like this one ("read[3]"): not ours
            index_text = index["index"]
            if kind == "step_started":
                journal.started.setdefault(index_text, payload)
            elif kind == "step_completed":
                journal.outcomes[index_text] = {"output": payload.get("output")}
            elif kind == "step_failed":
                journal.outcomes[index_text] = {"error": payload}
            elif kind == "approval_decided":
                journal.decisions[index_text] = payload
        return journal

    def loop_write(self, kind: str, index: str | None, payload: Any) -> None:
        """An engine row of the loop now (fenced): llm_turn on the step, a tool call's start or outcome on its item."""
        assert kind in ("llm_turn", "step_started", "step_completed", "step_failed"), kind
        sid = self.step_id if index is None else f"{self.step_id}[{index}]"
        self.walk.append([NewEvent(kind, sid, self.attempt, payload)])

    def loop_emit(self, index: str, kind: str, payload: Any = None) -> int:
        """A tool call's custom event (no reserved kind), on its item."""
        return self.walk.emit(f"{self.step_id}[{index}]", self.attempt)(kind, payload)

    def budget_check(self, tokens: int, cost: float) -> None:
        """Before a model call of the loop: a durable wait when a budget of the run (or an ancestor) has no room,
        counting what this attempt's turns so far spent (not yet in a step_completed)."""
        self.walk.flush()
        run = self.walk.run
        if not has_budget(run):
            return
        reached = budget_reached(run, extra_tokens=tokens, extra_cost=cost)
        if reached is not None:
            raise Wait({**reached, "step_id": self.step_id, "attempt": self.attempt})

    # --- an approval's request (runs.steps.waits) ----------------------------------------------------

    def open_request(self, payload: dict) -> None:
        """Journal the approval's approval_requested now (fenced), before its notifications announce it: a decision
        through their link finds it requested (runs.services.approval_decide of a running run)."""
        self._append("approval_requested", payload)
        self.state.events["approval_requested"] = payload

    # --- side effects (deliver) ------------------------------------------------------------------

    def claim(self, *, channel: str, target: str, key: str | None = None) -> tuple[SideEffect, bool]:
        """Take the key before sending (the attempt's, or one of its own: an approval's notification). Returns
        (row, True) for a new claim, (row, False) for an old one."""
        walk = self.walk
        key = key or self.key
        walk.flush()
        with transaction.atomic():
            leases.fence_check(walk.fence)
            effect, created = SideEffect.objects.get_or_create(
                key=key,
                defaults=dict(
                    run_id=walk.run.id,
                    step_id=self.step_id,
                    attempt=self.attempt,
                    channel=channel,
                    target=target,
                    claimed_epoch=walk.fence.epoch,
                    claimed_at=timezone.now(),
                ),
            )
            if created:
                self._append("side_effect_claimed", {"key": key, "channel": channel, "target": target})
        return effect, created

    def confirm(self, effect: SideEffect, *, status: str, response: Any = None) -> None:
        response = mask(response)  # a receiver's answer may echo what it was sent (a signature, a header)
        with transaction.atomic():
            leases.fence_check(self.walk.fence)
            effect.status = status
            effect.response = response
            if status == SideEffectStatus.DELIVERED:
                effect.delivered_at = timezone.now()
            effect.save(update_fields=["status", "response", "delivered_at", "updated_at"])
            self._append(
                CONFIRMED_KINDS.get(status, "side_effect_failed"),
                {"key": effect.key, "channel": effect.channel, "status": status, "response": response},
            )

    # --- rate limits -----------------------------------------------------------------------------

    def rate_limit(self, channel: str, name: str) -> list:
        """A slot in each limit of this call (runs.rate_limits), or a durable wait until the next one opens. A
        paused peer (runs.pauses) parks the step first, holding no worker; a paced resume's pace is a limit too."""
        self.dependency_hold(dependency_of(channel, name))
        slots, full = rate_take(channel=channel, name=name, run_id=self.walk.run.id, step_key=self.key)
        if full is None:
            return slots or []
        until = full["until"]
        raise Wait(
            {
                "kind": "rate_limit",
                "step_id": self.step_id,
                "attempt": self.attempt,
                **{k: v for k, v in full.items() if k != "until"},
                "until": until.isoformat(),
            },
            wake_at=until,
        )

    def dependency_hold(self, target: str) -> None:
        """Raise the Wait of a paused peer, or of a paced resume's next slot; nothing when its call may start."""
        pause = dependency_hold(target)
        if pause is None:
            return
        at = {"step_id": self.step_id, "attempt": self.attempt}
        if pause.active:
            raise Wait(wait_of(pause, **at), journal=[("run_paused", journal_payload(pause))])
        until = pace_take(pause, run_id=self.walk.run.id, step_key=self.key)
        if until is not None:
            limit = {"limit": f"pace:{target}", "per_second": pause.per_second, "until": until.isoformat()}
            raise Wait({"kind": "rate_limit", **at, **limit}, wake_at=until)

    # --- signals ---------------------------------------------------------------------------------

    def consume_signal(self, name: str) -> tuple[bool, Any]:
        """Take the oldest unconsumed signal of this name, exactly once, journaled in the same commit."""
        walk = self.walk
        walk.flush()
        with transaction.atomic():
            leases.fence_check(walk.fence)
            signal = Signal.objects.filter(run_id=walk.run.id, name=name, consumed_at__isnull=True).first()
            if signal is None:
                return False, None
            taken = Signal.objects.filter(id=signal.id, consumed_at__isnull=True).update(
                consumed_at=timezone.now(), consumed_step_id=self.step_id
            )
            if taken != 1:
                return False, None
            payload = {"name": name, "payload": signal.payload, "signal_id": signal.id, "sent_by": signal.sent_by}
            self._append("signal_received", payload)
        self.state.events["signal_received"] = payload
        return True, signal.payload

    # --- child runs ------------------------------------------------------------------------------

    def run_child(self, *, workflow: str, input: dict):
        """Create (or, after a crash, adopt) the child of this step attempt and drive it inline."""
        walk, state = self.walk, self.state
        walk.flush()
        child = (
            Run.objects.select_related("workflow")
            .filter(parent_run_id=walk.run.id, parent_step_id=self.step_id, parent_attempt=self.attempt)
            .first()
        )
        if child is None:
            child = self.child_create(workflow, input)
        elif not state.waiting and "child_sliced" not in state.events:
            # A crash left the child without our step_completed: adopt it. (After a slice, or a wait, this
            # walk goes on with its own child: nothing to adopt.)
            self._append("child_adopted", {"child_run_id": str(child.id), "status": child.status})
        self.extra["child_run_id"] = str(child.id)
        if child.status in FINAL_STATUSES or held_back(child):  # held back: a freed slot books it
            return self.child_outcome(child)
        if leases.lease_held_elsewhere(run_id=child.id):
            # The child walks under its own task (a freed slot booked it, an operator re-drove it): its ending
            # wakes this run (runs.walk.walk.Walk.finish). Wait on it, never fight its walk for its lease.
            return self.child_outcome(child, walked_elsewhere=True)
        if self.drive_child is None:
            raise StepError("a child run cannot be started from here (no walk drives it)", code="internal_error")
        self.drive_child(child, step_id=self.step_id, attempt=self.attempt)
        child.refresh_from_db()
        return self.child_outcome(child)

    def child_outcome(self, child: Run, *, walked_elsewhere: bool = False):
        """The step's outcome from its child's state: its output, a wait on it, or a failure naming it."""
        if child.status == RunStatus.SUCCEEDED:
            return child.output
        if child.status == RunStatus.WAITING or held_back(child) or walked_elsewhere:
            # The child parked (an approval, a signal, a timer, its own child), or waits for a slot of its group:
            # so does this run, and waking the child (or its ending, once a slot is handed to it) wakes this run
            # too (runs.services.run_wake walks up the tree).
            raise Wait(
                {
                    "kind": "child",
                    "step_id": self.step_id,
                    "attempt": self.attempt,
                    "child_run_id": str(child.id),
                    "child_waiting_on": child.waiting_on,
                }
            )
        if child.status in (RunStatus.RUNNING, RunStatus.QUEUED):
            raise FencedOut(self.walk.fence)  # the child's walk was fenced out; so are we
        error = child.error or {}
        raise StepError(
            f"child run {child.id} ({child.workflow.name}) ended {child.status}"
            + (f": {error.get('message')}" if error.get("message") else ""),
            code=f"child_{child.status}",
            # Only the child's own code and message: a grandchild's error is one click further down.
            details={
                "child_run_id": str(child.id),
                "error": {k: error.get(k) for k in ("code", "message", "step_id")},
            },
        )

    def child_create(self, workflow_name: str, input: dict) -> Run:
        walk = self.walk
        # Depth comes from the database (the parent's row), never from a context value that a replay resets.
        depth = walk.run.depth + 1
        limit = settings.PAL_MAX_CHILD_DEPTH
        if depth > limit:
            raise StepError(
                f"a child run here would be at depth {depth}; the limit is PAL_MAX_CHILD_DEPTH={limit}",
                code="max_child_depth",
                details={"depth": depth, "limit": limit},
            )
        try:
            workflow = workflow_get(name=workflow_name)  # the latest version (a Python workflow's: this code's)
        except NotFound:
            raise StepError(f"child workflow {workflow_name!r} does not exist", code="workflow_not_found") from None
        with transaction.atomic():
            leases.fence_check(walk.fence)
            child = run_create_child(
                parent=walk.run,
                step_id=self.step_id,
                attempt=self.attempt,
                workflow=workflow,
                input=input,
                by=walk.writer,
            )
            self._append(
                "child_created",
                {"child_run_id": str(child.id), "workflow": workflow.name, "version": workflow.version, "depth": depth},
            )
        return Run.objects.select_related("workflow").get(id=child.id)

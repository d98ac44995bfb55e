"""The contract of a step kind, and the registry of kinds by name.

A step kind validates its own fields when a workflow is posted and acts when the executor reaches it.
It never touches the journal's bookkeeping (step_started / step_completed): the executor does that.
"""

import logging
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from journal.services import FencedOut
from pal.clock import db_now
from pal.db_away import CONNECTION_ERRORS

from ..errors import LeaseLost, StepError, Wait, outcome_unknown
from ..secrets import mask

log = logging.getLogger("pal.steps")
REGISTRY: dict[str, "StepKind"] = {}
NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")  # workflow names and step ids
# A task of Django's task framework is a workflow named after it (pal.tasks): task:<module>.<function>.
TASK_WORKFLOW_RE = re.compile(r"^task:[A-Za-z_][A-Za-z0-9_.]{0,58}$")


PAUSE_TICK = 0.1  # seconds between looks at the heartbeat's flag during a pause (StepContext.pause)
PAUSE_LOOK = 1.0  # seconds between reads of the lease in the database during a pause


@dataclass
class StepContext:
    """What a step gets besides its rendered fields."""

    run_id: str
    step_id: str
    attempt: int
    key: str  # {run_id}:{step_id}:{attempt}
    resumed: bool  # this attempt had started before (a re-drive after a crash)
    timeout: float | None
    emit: Callable[[str, Any], int]  # append a custom journal event (not a reserved kind)
    lease_lost: Callable[[], bool]
    claim: Callable[..., Any]  # runs.walk.capabilities side-effect claim, for deliver
    confirm: Callable[..., Any]
    find: Callable[[str], Any] = lambda kind: None  # this attempt's last journaled payload of a kind, or None
    consume_signal: Callable[[str], tuple[bool, Any]] | None = None
    child: Callable[..., Any] | None = None  # runs.walk: create or adopt, then drive, a child run
    extra: dict = field(default_factory=dict)  # merged into the step_completed payload (e.g. child_run_id)
    # Before each try of a call to a peer: take a slot of its rate limits (PAL_RATE_LIMITS), or wait durably
    # (raises Wait) when one is full. Returns the slots taken; rate_report gives them the tokens the call reported.
    rate_limit: Callable[[str, str], list] = lambda channel, name: []
    rate_report: Callable[[list, int], None] = lambda slots, tokens: None
    deadline: float | None = None  # time.monotonic() past which the step has used its timeout_seconds
    # Set by a step that has (or may have) sent its side effect under this attempt's key, in this run of the
    # attempt or an earlier one: from then on a spent deadline says nothing about whether the peer took it.
    sent: bool = False
    # The lease as the database has it (a read of its owner and epoch, not the heartbeat's flag): raises FencedOut
    # when the run was cancelled or its lease taken. On the walk's thread (branch threads forward it there).
    lease_check: Callable[[], None] = lambda: None
    # The agent loop of an llm_call with tools (runs.steps.llm_loop): what this attempt's journal holds of its turns
    # and tool calls (a LoopJournal), an engine row for it (kind, the tool call's index "turn.n" or None, payload)
    # written now, a tool call's custom event, and a durable wait when a budget of the run has no room for the next
    # model call.
    loop_read: Callable[[], Any] = lambda: None
    loop_write: Callable[[str, str | None, Any], None] = lambda kind, index, payload: None
    loop_emit: Callable[[str, str, Any], int] = lambda index, kind, payload: 0  # a tool call's custom event
    budget_check: Callable[[int, float], None] = lambda tokens, cost: None
    # An approval with notify: its approval_requested journaled now, before the notifications go out.
    open_request: Callable[[dict], None] = lambda payload: None
    # The database's clock (pal.clock), read on the walk's thread: a branch's thread holds no connection of its own.
    clock: Callable[[], datetime] = db_now

    def time_left(self) -> float | None:
        """Seconds until the deadline (never below 0), or None without a timeout_seconds."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def lease_held(self) -> None:
        """Before each try of a call to a peer: a cancelled or stolen run sends nothing more. The heartbeat's flag,
        then the database (lease_check), since the flag lags a cancel by up to a heartbeat."""
        if self.lease_lost():
            raise LeaseLost(f"lease on run {self.run_id} was lost during step {self.step_id}")
        self.lease_check()

    def pause(self, seconds: float) -> None:
        """Sleep between tries (a back-off, a Retry-After), stopped at once by a cancel or a steal: the heartbeat's
        flag is looked at every PAUSE_TICK seconds and the database every PAUSE_LOOK, and once more at the end."""
        end = looked = time.monotonic()
        end += seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, PAUSE_TICK))
            if self.lease_lost():
                raise LeaseLost(f"lease on run {self.run_id} was lost during step {self.step_id}")
            if time.monotonic() - looked >= PAUSE_LOOK:
                self.lease_check()
                looked = time.monotonic()
        self.lease_held()

    def check_lease(self):
        """Long steps call this between pieces of work: it stops the step when the lease was lost (a steal or a
        cancel) or when the step's timeout_seconds is spent. A deadline that passes before anything was sent is
        a definite step_timeout; once something may have been sent (ctx.sent) the outcome is unknown, so the
        step goes again under the same key instead of failing (docs/reference/keys.md)."""
        if self.lease_lost():
            raise LeaseLost(f"lease on run {self.run_id} was lost during step {self.step_id}")
        if self.deadline is not None and time.monotonic() > self.deadline:
            if self.sent:
                raise StepError(
                    f"step {self.step_id} ran past its {self.timeout:g}s after sending under key "
                    f"{self.key}; whether the peer took it is unknown, so it goes again under that key",
                    permanent=False,
                    code="step_timeout_unknown",
                )
            raise StepError(f"step {self.step_id} timed out after {self.timeout:g}s", code="step_timeout")


def run_masked(run: Callable[[dict, "StepContext"], Any], step: dict, ctx: StepContext) -> Any:
    """run(step, ctx) for a step kind that runs someone else's code (an agent, a tool): nothing it hands to the
    journal holds a configured secret value (runs.secrets): not its custom events, its output, nor the message
    and details of its StepError. An exception of another kind from the code is a bug in it: it becomes a
    masked internal_error, as the executor would journal it. Engine exceptions pass as they are."""
    emit = ctx.emit

    def masked_emit(kind: str, payload: Any = None) -> int:
        return emit(mask(kind), mask(payload))

    ctx.emit = masked_emit
    try:
        return mask(run(step, ctx))
    except StepError as exc:
        exc.message, exc.details = mask(exc.message), mask(exc.details)
        exc.args = (exc.message,)
        raise
    except (LeaseLost, Wait, FencedOut, *CONNECTION_ERRORS):
        raise
    except Exception as exc:
        message = mask(f"{type(exc).__name__}: {exc}")
        log.error("step %s of run %s raised %s\n%s", ctx.step_id, ctx.run_id, message, mask(traceback.format_exc()))
        raise StepError(message, code="internal_error") from None


class StepKind:
    """Base class. Subclasses set `kind` and `required` and implement `run`.

    validate(step) returns a list of (field, message) for a definition being posted; run(step, ctx)
    gets the step with its templates rendered and returns a JSON-able output or raises StepError.
    """

    kind: str = ""
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    # Fields whose strings are templates rendered before run(); the rest are passed as they are.
    templated: tuple[str, ...] = ()

    def validate(self, step: dict) -> list[tuple[str, str]]:
        return []

    def run(self, step: dict, ctx: StepContext) -> Any:
        raise NotImplementedError


def register(cls):
    REGISTRY[cls.kind] = cls()
    return cls


def get_kind(name: str) -> StepKind | None:
    return REGISTRY.get(name)


# The step outcomes live in runs.errors; step kinds and tools have always imported them from here too.
__all__ = [
    "NAME_RE",
    "TASK_WORKFLOW_RE",
    "LeaseLost",
    "StepContext",
    "StepError",
    "StepKind",
    "Wait",
    "get_kind",
    "outcome_unknown",
    "register",
]

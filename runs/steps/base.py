"""The contract of a step kind, and the registry of kinds by name.

A step kind validates its own fields when a workflow is posted and acts when the executor reaches it.
It never touches the journal's bookkeeping (step_started / step_completed): the executor does that.
"""

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

REGISTRY: dict[str, "StepKind"] = {}
NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")  # workflow names and step ids


class StepError(Exception):
    """A step attempt failed.

    permanent=True is a definite failure (a 4xx other than 408/429, a validation error, a refusal):
    the executor journals step_failed. permanent=False is an outcome we do not know (timeout, connection
    lost after sending): the step may retry inside the same attempt with the same key.
    """

    def __init__(self, message: str, *, permanent: bool = True, code: str = "step_error", details: Any = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.code = code
        self.details = details

    def as_payload(self) -> dict:
        payload = {"message": self.message, "code": self.code, "permanent": self.permanent}
        if self.details is not None:
            payload["details"] = self.details
        return payload


class Wait(Exception):
    """Park the run: waiting_on says on what (kind approval / signal / timer / child, step_id, attempt, ...),
    wake_at is a durable timer, journal lists (kind, payload) events to write with run_waiting."""

    def __init__(self, waiting_on: dict, *, wake_at=None, journal: list | None = None):
        super().__init__(f"waiting on {waiting_on.get('kind')}")
        self.waiting_on = waiting_on
        self.wake_at = wake_at
        self.journal = journal or []


class LeaseLost(Exception):
    """Raised inside a long step when the heartbeat saw our lease go (stolen or cancelled)."""


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
    claim: Callable[..., Any]  # runs.executor side-effect claim, for deliver
    confirm: Callable[..., Any]
    find: Callable[[str], Any] = lambda kind: None  # this attempt's last journaled payload of a kind, or None
    consume_signal: Callable[[str], tuple[bool, Any]] | None = None
    child: Callable[..., Any] | None = None  # runs.executor: create or adopt, then drive, a child run
    extra: dict = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() past which the step has used its timeout_seconds  # merged into the step_completed payload (e.g. child_run_id)

    def check_lease(self):
        """Long steps call this between pieces of work: it stops the step when the lease was lost (a steal or a
        cancel) or when the step's timeout_seconds is spent."""
        if self.lease_lost():
            raise LeaseLost(f"lease on run {self.run_id} was lost during step {self.step_id}")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise StepError(f"step {self.step_id} timed out after {self.timeout:g}s", code="step_timeout")


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

"""What the engine's callers catch: an operator's refusal (ServiceError and its kinds, answered by the API with
their status and code); a step attempt's outcome other than its output (StepError, Wait, LeaseLost), raised by
step kinds and providers alike; and the two ways a walk stops that are not the run's outcome (SliceOver,
Interrupted)."""

from typing import Any

from .secrets import mask


class ServiceError(Exception):
    """A refusal an operator can read. code is stable for the API; status is the HTTP answer."""

    status = 400

    def __init__(self, detail: str, *, code: str = "invalid", status: int | None = None):
        super().__init__(detail)
        self.detail = detail
        self.code = code
        if status is not None:
            self.status = status


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class SliceOver(Exception):
    """A child driven inline used up its root's slice: the root hands its run to a new task, the child's lease
    is released, and the next slice drives the child on from where it stopped."""


class Interrupted(Exception):
    """The database failed under a walk (a claim, a confirm, a signal's consumption, a child's creation): not the
    step's failure. The walk stops without journaling an outcome and the run is left to the sweep."""


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
        """The journal's form of this failure, every configured secret value masked (a peer's error body may
        echo a header it was sent): the one place an error's message and details are made journal-safe."""
        payload = {"message": mask(self.message), "code": self.code, "permanent": self.permanent}
        if self.details is not None:
            payload["details"] = mask(self.details)
        return payload


def outcome_unknown(failure: dict | None) -> bool:
    """A journaled step_failed (StepError.as_payload) whose outcome was not known (a timeout, a connection lost
    after sending): whatever tries it again (max_attempts, an operator's retry) sends the same attempt under the
    same key, never a new attempt (docs/reference/keys.md)."""
    return isinstance(failure, dict) and failure.get("permanent") is False


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

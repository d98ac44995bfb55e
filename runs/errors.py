"""What the engine's callers catch: an operator's refusal (ServiceError and its kinds, answered by the API with
their status and code) and the two ways a walk stops that are not the run's outcome (SliceOver, Interrupted)."""


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

"""What the walk and its scheduler share: an attempt's Outcome, a Branch (a step or an item as it runs) and the
Forward that lets a branch's thread ask the walk's thread to write for it."""

import enum
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..errors import LeaseLost, StepError, Wait
from ..replay import StepState
from ..steps.base import StepContext
from ..workflows import step_invoke

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
# What telemetry calls each (the span's pal.outcome, the step histogram's label).
OUTCOME_WORDS = {
    Result.DONE: "completed",
    Result.FAILED: "failed",
    Result.WAITING: "waiting",
    Result.RETRY_LATER: "unknown",
}


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
    fleet: bool = False  # booked for the fleet (runs.walk.fleet): a worker runs it, its outcome comes in its row
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

"""A walk that raises from the engine's own code (a bug, not a step's failure) must not be re-driven for ever."""

# Each such crash is journaled `walk_crashed` under the walk's lease and the run is left to the sweep, so a fault
# that passes costs one re-drive. The crashes count in a row: a step that ends (or fails, or is skipped), a park or
# an operator's retry in between starts the count again. The PAL_WALK_CRASHES-th in a row fails the run with
# `internal_error` and the traceback's last line (runs.walk: run_drive).

import traceback
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from journal.selectors import events_since
from journal.services import NewEvent

from .secrets import mask

# A row of one of these kinds means the walk got past the point where it crashed before.
MOVED_ON = ("step_completed", "step_failed", "step_skipped", "run_waiting", "run_retried")


@dataclass(frozen=True)
class Crash:
    """One crash of a walk: what it was, where, and how many in a row it makes."""

    message: str  # the traceback's last line ("KeyError: 'x'"), every configured secret masked
    at: str  # the innermost frame: "runs/walk/walk.py:123 in ready"
    crashes: int
    limit: int

    @property
    def final(self) -> bool:
        return self.crashes >= self.limit

    def event(self) -> NewEvent:
        return NewEvent("walk_crashed", payload={"message": self.message, "at": self.at, "crashes": self.crashes})

    def failure(self) -> dict:
        """The run's error once the crashes reach the limit."""
        return {
            "message": self.message,
            "code": "internal_error",
            "permanent": True,
            "details": {"at": self.at, "crashes": self.crashes},
        }


def crash_note(*, run_id, error: BaseException) -> Crash:
    """What to journal of a walk that raised `error`: its last line, where, and its number in the row."""
    message = mask("".join(traceback.format_exception_only(type(error), error)).strip().splitlines()[-1])
    frames = traceback.extract_tb(error.__traceback__)
    at = ""
    if frames:
        frame = frames[-1]
        path = Path(frame.filename)
        shown = path.relative_to(settings.BASE_DIR) if path.is_relative_to(settings.BASE_DIR) else path.name
        at = f"{shown}:{frame.lineno} in {frame.name}"
    before = events_since(run_id=run_id, kind="walk_crashed", since_kinds=MOVED_ON)
    return Crash(message=message, at=at, crashes=before + 1, limit=settings.PAL_WALK_CRASHES)

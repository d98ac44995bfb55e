"""The one writer of a run's journal rows during a walk: the walk, a fleet item's worker and a step's
capabilities all append through a JournalWriter, never through a copy of its block."""

# flush() appends what is pending, fenced by the lease (FencedOut when it is no longer the writer's); append()
# writes rows now, after the pending ones; commit() appends the pending rows inside a transaction that has just
# given the lease up (a parking, a hand-off, the end), stamped with the lease's epoch instead of checking it.
# Attributes of the run that a pending step_completed sets go in the same commit as its rows (runs.attributes).
# defer() lets consecutive pure steps start with the rows pending unwritten, bounded: a crash re-runs only them.

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

from journal.models import RESERVED_KINDS
from journal.services import Fence, NewEvent, Tail, dumps_json, events_append

from ..attributes import attributes_set
from ..errors import StepError


class JournalWriter:
    def __init__(self, run: Any, fence: Fence, *, writer: str | None = None):
        self.run = run
        self.fence = fence
        self.writer = writer or fence.owner
        self.pending: list[NewEvent] = []
        self.tail: Tail | None = None  # the run's last row when the writer knows it (appends then skip reading it)
        self.attributes: dict[str, Any] = {}  # the run's attributes that the pending rows set: written with them
        self.deferred = 0  # pure steps started since the last write, whose rows wait for a later commit
        self.deferred_since = 0.0  # time.monotonic() of the first of them

    def flush(self) -> None:
        if self.pending:
            self._write(self.pending, fenced=True)
            self.pending = []
        self.deferred = 0

    def defer(self, steps: int) -> bool:
        """Whether `steps` more pure steps may start with the rows pending unwritten (PAL_PURE_BATCH_STEPS and
        PAL_PURE_BATCH_MS bound what a crash re-runs); when so they are counted."""
        now = time.monotonic()
        if self.deferred == 0:
            self.deferred_since = now
        if (
            self.deferred + steps > settings.PAL_PURE_BATCH_STEPS
            or (now - self.deferred_since) * 1000 >= settings.PAL_PURE_BATCH_MS
        ):
            return False
        self.deferred += steps
        return True

    def append(self, events: list[NewEvent]) -> list[int]:
        """These rows now, after whatever is pending, fenced by the lease; their seqs."""
        self.flush()
        return self._write(events, fenced=True)

    def commit(self, events: list[NewEvent] | None = None) -> None:
        """The pending rows and these, in the caller's transaction, which gave the lease up: stamped with its
        epoch (the lease row is gone or handed on, so there is nothing left to check it against)."""
        if events:
            self.pending += events
        if self.pending:
            self._write(self.pending, fenced=False)
            self.pending = []
        self.deferred = 0

    def emit(self, step_id: str, attempt: int) -> Callable[..., int]:
        """A step's emit(kind, payload): a custom event (no reserved kind) after what is pending, fenced."""

        def emit(kind: str, payload: Any = None) -> int:
            if kind in RESERVED_KINDS:
                raise StepError(f"kind {kind!r} is reserved for the engine", code="reserved_kind")
            written = dumps_json(payload, what=f"the payload of event {kind!r}")  # NotJSON for the step to handle
            return self.append([NewEvent(kind, step_id, attempt, payload, payload_json=written)])[0]

        return emit

    def _write(self, events: list[NewEvent], *, fenced: bool) -> list[int]:
        if not self.attributes:
            return self._append(events, fenced=fenced)
        with transaction.atomic():  # fenced: the lease row stays locked (FOR SHARE) until this commit
            seqs = self._append(events, fenced=fenced)
            attributes_set(run_id=self.run.id, created_at=self.run.created_at, values=self.attributes)
        self.attributes = {}
        return seqs

    def _append(self, events: list[NewEvent], *, fenced: bool) -> list[int]:
        if fenced:
            return events_append(
                run_id=self.run.id, tail=self.tail, events=events, writer=self.writer, fence=self.fence
            )
        return events_append(
            run_id=self.run.id, tail=self.tail, events=events, writer=self.writer, epoch=self.fence.epoch
        )

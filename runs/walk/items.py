"""The graph scheduler's side of items on the fleet (runs.walk.fleet): booking them, polling their rows, taking
back a booking no worker took, adopting what an earlier walk left; and what the scheduler asks of the walk."""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction

from journal.services import NewEvent

from .. import leases
from ..dispatch import enqueue_item
from ..errors import StepError, Wait
from ..replay import MISSING, StepState
from .branch import Branch
from .fleet import FLEET_KINDS, Booking, ItemRow, item_take_back, items_book, items_done, items_drop, items_of

log = logging.getLogger("pal.executor")


class Walker(Protocol):
    """What a graph asks of the walk that made it (runs.walk.walk.Walk, which hands itself in): its run, its
    journal's writer, and the walk's own steps of a branch's life."""

    run: Any
    fence: Any
    pending: list[NewEvent]
    definition: dict
    step_context: dict[str, dict]
    items_booked: bool
    deadline: float | None
    nested: bool

    def flush(self) -> None: ...

    def defer(self, steps: int) -> bool: ...
    def remember(self, step_id: str, output: Any, *, ended: bool = True) -> None: ...
    def context(self, item: tuple[int, Any] | None = None) -> dict: ...
    def next_try(self, state: StepState) -> Any: ...
    def settle(self, branch: Branch, output: Any, error: BaseException | None) -> Any: ...
    def begin(self, branch: Branch, *, journal: bool = True) -> Any: ...
    def journal_start(self, branch: Branch, key: str, *, resumed: bool) -> None: ...
    def go_waiting(self, parked: list[Branch]) -> list[Branch]: ...
    def park(self, waiting_on: dict) -> None: ...
    def sleep_fenced(self, seconds: float) -> Any: ...
    def handoff(self, *, reason: str, delay: float = 0.0, retry_step: str | None = None) -> Any: ...
    def end_slice(self) -> Any: ...
    def finish_succeeded(self, output: Any = MISSING) -> Any: ...
    def finish_failed(self, step_id: str | None, attempt: int | None, failure: dict, *, expect: Any = ...) -> Any: ...


class FleetItems:
    """Graph's methods for its items on the fleet; the state they use is Graph's (set in its __init__)."""

    walk: Walker
    fleet: bool
    fleet_window: int
    next_poll: float
    stopping: bool
    left: dict[str, ItemRow]
    running: dict[str, Branch]
    pool: ThreadPoolExecutor | None

    def outcome(self, branch: Branch, output: Any, error: BaseException | None) -> None:
        raise NotImplementedError

    def body(self, branch: Branch) -> None:
        raise NotImplementedError

    @staticmethod
    def adoptable(left: ItemRow, state: StepState | None) -> bool:
        """An earlier walk's item row that this walk waits for: the same attempt, started and not waiting, with its
        outcome in, or taken by a worker whose lease is live."""
        return (
            state is not None
            and state.output is MISSING
            and left.attempt == state.attempt
            and state.started
            and not state.waiting
            and (left.result is not None or (not left.booked and left.live))  # live by the database's clock
        )

    def drop_left(self, sids: list[str]) -> None:
        """Delete these rows of an earlier walk in a fenced commit (runs.walk.fleet.items_drop)."""
        if not sids:
            return
        with transaction.atomic():
            leases.fence_check(self.walk.fence)
            items_drop(run_id=self.walk.run.id, sids=sids)
        for sid in sids:
            self.left.pop(sid, None)

    def for_fleet(self, branch: Branch) -> bool:
        """An agent loop (an llm_call with tools) stays in the walk: its turns and tool calls are journaled as
        they come, which a fleet item's one outcome row cannot say."""
        return (
            self.fleet
            and branch.step["kind"] in FLEET_KINDS
            and branch.problem is None
            and not (branch.step["kind"] == "llm_call" and branch.step.get("tools"))
        )

    def book(self, bookings: list[tuple[Branch, Booking]]) -> None:
        """Journal what is pending and book these items for the fleet in one fenced commit; send their tasks
        after it."""
        walk = self.walk
        if not bookings:
            return walk.flush()
        with transaction.atomic():
            leases.fence_check(walk.fence)
            walk.flush()
            sent = items_book(run_id=walk.run.id, bookings=[booking for _, booking in bookings])
            for sid, task_id in sent:
                enqueue_item(run_id=walk.run.id, sid=sid, task_id=task_id)
        walk.items_booked = True
        now = time.monotonic()
        for (branch, _), (_, task_id) in zip(bookings, sent, strict=True):
            branch.fleet, branch.booking, branch.booked_at = True, leases.task_owner(task_id), now
        self.next_poll = now + settings.PAL_ITEM_POLL_SECONDS

    def on_fleet(self) -> list[Branch]:
        return [branch for branch in self.running.values() if branch.fleet]

    def poll(self) -> None:
        """Read the run's item rows: journal the outcomes that came (deleting their rows in that commit), take back
        the bookings no worker took in time, book again an item whose worker died."""
        walk = self.walk
        self.next_poll = time.monotonic() + settings.PAL_ITEM_POLL_SECONDS
        rows = items_of(run_id=walk.run.id)
        came: list[ItemRow] = []
        rebook: list[tuple[Branch, Booking]] = []
        local = sum(1 for branch in self.running.values() if not branch.fleet)
        clock = time.monotonic()
        for branch in self.on_fleet():
            row = rows.get(branch.sid)
            if row is None or row.attempt != branch.state.attempt:
                with transaction.atomic():
                    leases.fence_check(walk.fence)  # a cancel dropped the run's leases, ours too: stop
                rebook.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields or {}, True, branch.step))
                )
            elif row.result is not None:
                if branch.booking:  # a worker took it and is done already: the fleet has room for one more
                    self.fleet_window = min(settings.PAL_WALK_THREADS * 4, self.fleet_window + 1)
                came.append(row)
                self.outcome(branch, *_item_outcome(branch, row.result))
            elif row.booked:
                waited = clock - branch.booked_at >= settings.PAL_ITEM_PICKUP_SECONDS
                if (self.stopping or (waited and local < settings.PAL_WALK_THREADS)) and self.take_back(branch, row):
                    local += 1
                    self.fleet_window = max(1, self.fleet_window // 2)
            elif branch.booking:
                branch.booking = ""  # a worker took it: the fleet has room for one more
                self.fleet_window = min(settings.PAL_WALK_THREADS * 4, self.fleet_window + 1)
            elif not row.live:
                log.warning(
                    "run %s: item %s's worker %s stopped beating; booked again", walk.run.id, row.sid, row.owner
                )
                rebook.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields or {}, True, branch.step))
                )
                # The same attempt again on another worker: journaled as a resumed start, as after a crash.
                walk.journal_start(branch, branch.context().key, resumed=True)
                branch.context().resumed = True  # if it comes back to this walk's threads
        if came:
            with transaction.atomic():
                leases.fence_check(walk.fence)
                walk.flush()
                items_done(run_id=walk.run.id, rows=came)
        if rebook:
            self.book(rebook)

    def take_back(self, branch: Branch, row: ItemRow) -> bool:
        """A booking no worker took: the walk runs it on a thread of its own (or, when its slice is over, leaves it
        started for the next slice). False when a worker took it first."""
        walk = self.walk
        with transaction.atomic():
            leases.fence_check(walk.fence)
            if not item_take_back(run_id=walk.run.id, sid=branch.sid, owner=row.owner):
                return False
        branch.fleet, branch.booking = False, ""
        if self.stopping:
            del self.running[branch.sid]  # it stays started: the next slice resumes it under the same key
            return True
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=settings.PAL_WALK_THREADS, thread_name_prefix="pal-branch")
        self.pool.submit(self.body, branch)
        return True


def _item_outcome(branch: Branch, result: dict) -> tuple[Any, BaseException | None]:
    """An item's outcome as its worker wrote it (run_item), as the walk's settle() takes it."""
    if branch.ctx is not None:
        branch.ctx.extra.update(result.get("extra") or {})
    if "ms" in result:  # the item's own time on its worker, not since this walk began (or adopted) it
        branch.began = time.monotonic() - float(result["ms"]) / 1000
        branch.took = float(result["ms"]) / 1000
    if "output" in result:
        return result["output"], None
    if "wait" in result:
        wait = result["wait"]
        wake_at = datetime.fromisoformat(wait["wake_at"]) if wait.get("wake_at") else None
        return None, Wait(wait["waiting_on"], wake_at=wake_at, journal=[tuple(pair) for pair in wait["journal"]])
    error = result.get("error") or {}
    return None, StepError(
        str(error.get("message", "")),
        permanent=bool(error.get("permanent", True)),
        code=str(error.get("code", "step_error")),
        details=error.get("details"),
    )

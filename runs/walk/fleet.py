"""Items of a fan-out on the whole fleet: the branch_locks rows (runs.models.BranchLock)."""

# The walk of a run books an item for one Celery task id (in the commit that journals the item's step_started);
# whichever worker receives the task takes the item under its own name (epoch + 1), beats its lease while the item
# runs (runs.leases.heartbeat) and writes the item's outcome into the row. The walk reads its run's rows (one read
# keyed by run_id), journals each outcome and deletes its row in one commit, so an outcome is always in exactly one
# place: the row until it is journaled, then the journal.
#
# A booking that no worker took within PAL_ITEM_PICKUP_SECONDS the walk takes back (a conditional delete that only
# an untaken booking matches) and runs on one of its own threads: a busy fleet costs nothing, an idle one shares
# the work. A taken item whose lease expired (its worker died) is booked again: the same attempt and key, resumed,
# and the old writer is fenced out, since every fenced write names the (owner, epoch) it was given.

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone

from journal.services import Fence, FencedOut, NotJSON, dumps, dumps_json
from journal.text import StorableJSONDecoder
from pal.clock import db_clock, db_clock_sql
from pal.db_away import CONNECTION_ERRORS

from .. import leases
from ..errors import Interrupted, LeaseLost, StepError, Wait
from ..models import BranchLock, Run
from ..replay import StepState, step_key
from ..secrets import mask
from ..workflows import step_invoke
from .capabilities import StepCapabilities
from .writer import JournalWriter

# The kinds whose items go to the fleet: they call out and need nothing of the walk but fenced writes. An approval,
# a signal, a timer or a child run parks or drives inside the walk, so those stay on the walk's threads.
log = logging.getLogger("pal.executor")

FLEET_KINDS = frozenset({"tool_call", "llm_call", "deliver", "agent", "python"})


@dataclass(frozen=True)
class Booking:
    sid: str
    attempt: int
    fields: dict
    resumed: bool
    step: dict | None = None  # the step's definition: the worker that takes it reads nothing else of the run


@dataclass(frozen=True)
class ItemRow:
    """An item's row as the walk reads it."""

    sid: str
    attempt: int
    owner: str
    epoch: int
    expires_at: Any
    booked_at: Any
    result: Any
    live: bool = False  # its lease has not expired, by the database's clock (read with the row)

    @property
    def booked(self) -> bool:
        """Not taken by a worker yet (owner is the booking's task)."""
        return self.owner.startswith("task:")


def _uuid(value):
    value = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return value if connection.vendor == "postgresql" else value.hex


def items_book(*, run_id, bookings: list[Booking]) -> list[tuple[str, str]]:
    """Inside the walk's fenced commit: book each item for a new task id; returns [(sid, task id)] to send after
    commit (runs.dispatch.enqueue_item). A row left for the same item (an earlier attempt, a dead worker) is
    replaced: its epoch starts anew from the clock (microseconds), and above any epoch it had in any case (each
    take adds one), so its old writer stays fenced out whatever this host's clock says. Expiries are by the
    database's clock (pal.clock)."""
    if not bookings:
        return []
    now = timezone.now()  # booked_at: recorded only (the walk times a pickup by its own monotonic clock)
    expires, expires_params = db_clock_sql(settings.PAL_LEASE_TTL)
    jsonb = "::jsonb" if connection.vendor == "postgresql" else ""
    epoch = time.time_ns() // 1000
    sent, params = [], []
    for booking in bookings:
        task_id = str(uuid.uuid4())
        params += [_uuid(run_id), booking.sid, booking.attempt, f"task:{task_id}", epoch, *expires_params, now]
        params += [booking.resumed, dumps({"fields": booking.fields, "step": booking.step})]
        sent.append((booking.sid, task_id))
    rows = ", ".join([f"(%s, %s, %s, %s, %s, {expires}, %s, %s, %s{jsonb}, NULL)"] * len(bookings))
    with connection.cursor() as cursor:  # one statement for all of them
        cursor.execute(
            "INSERT INTO branch_locks (run_id, sid, attempt, owner, epoch, expires_at, booked_at, resumed, fields, "
            f"result) VALUES {rows} "
            "ON CONFLICT (run_id, sid) DO UPDATE SET attempt = excluded.attempt, owner = excluded.owner, "
            "epoch = CASE WHEN excluded.epoch > branch_locks.epoch THEN excluded.epoch "
            "ELSE branch_locks.epoch + 1 END, expires_at = excluded.expires_at, booked_at = excluded.booked_at, "
            "resumed = excluded.resumed, fields = excluded.fields, result = NULL",
            params,
        )
    return sent


def items_of(*, run_id) -> dict[str, ItemRow]:
    """Every item row of the run (one read by run_id), with whether its lease is live by the database's clock."""
    live = ExpressionWrapper(Q(expires_at__gte=db_clock()), output_field=BooleanField())
    rows = (
        BranchLock.objects.filter(run_id=run_id)
        .annotate(live=live)
        .values_list("sid", "attempt", "owner", "epoch", "expires_at", "booked_at", "result", "live")
    )
    return {row[0]: ItemRow(*row) for row in rows}


def item_take_back(*, run_id, sid: str, owner: str) -> bool:
    """The walk takes back a booking no worker took (inside its fenced commit): True when it won."""
    return BranchLock.objects.filter(run_id=run_id, sid=sid, owner=owner).delete()[0] == 1


def items_done(*, run_id, rows: list[ItemRow]) -> None:
    """Inside the commit that journals their outcomes: the rows go (each only as it was read)."""
    if not rows:
        return
    each = Q()
    for row in rows:
        each |= Q(sid=row.sid, epoch=row.epoch)
    BranchLock.objects.filter(each, run_id=run_id).delete()  # one statement


def items_drop(*, run_id, sids: list[str]) -> None:
    """Inside the walk's fenced commit: these items' rows go, whatever their epoch (a worker that took one since
    the walk read it is fenced out too): a later take of their bookings finds nothing, their writers' writes fail."""
    if sids:
        BranchLock.objects.filter(run_id=run_id, sid__in=sids).delete()


@dataclass(frozen=True)
class Taken:
    fence: Fence
    attempt: int
    fields: dict
    resumed: bool
    step: dict | None


def item_take(*, run_id, sid: str, task_id: str, owner: str) -> Taken | None:
    """A worker that received an item's task takes it under its own name, in one statement: None when the booking is
    gone (the walk took it back, a cancel dropped it, or it was booked again for another task)."""
    text = "::text" if connection.vendor == "postgresql" else ""
    expires, expires_params = db_clock_sql(settings.PAL_LEASE_TTL)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE branch_locks SET owner = %s, epoch = epoch + 1, expires_at = {expires} "
            f"WHERE run_id = %s AND sid = %s AND owner = %s RETURNING epoch, attempt, resumed, fields{text}",
            [owner, *expires_params, _uuid(run_id), sid, f"task:{task_id}"],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    epoch, attempt, resumed, stored = row
    booked = json.loads(stored, cls=StorableJSONDecoder)  # as the journal's payloads are read back
    run_uuid = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    fence = Fence(run_uuid, owner, epoch, branch=sid)
    return Taken(fence, attempt, booked["fields"], bool(resumed), booked.get("step"))


def item_finish(*, fence: Fence, result: dict) -> bool:
    """The item's outcome into its row, while its lease holds: False when it was fenced out meanwhile."""
    return (
        BranchLock.objects.filter(run_id=fence.run_id, sid=fence.branch, owner=fence.owner, epoch=fence.epoch).update(
            result=result, expires_at=db_clock(settings.PAL_LEASE_TTL)
        )
        == 1
    )


def item_holds(*, fence: Fence) -> bool:
    """The item's lease is still its writer's and live: read before each try of a call to a peer, so a worker woken
    from a freeze after its item went to another worker sends nothing more (runs.walk.run_item)."""
    return BranchLock.objects.filter(
        run_id=fence.run_id,
        sid=fence.branch,
        owner=fence.owner,
        epoch=fence.epoch,
        expires_at__gte=db_clock(),
    ).exists()


class ItemWriter(JournalWriter):
    """The journal writer of an item on the worker that took it: the item's own fence (its branch_locks row) in
    place of the walk's; nothing pending (each row goes as it comes), the tail read at each append (the walk
    appends too)."""

    def __init__(self, run: Run, fence: Fence):
        super().__init__(run, fence, writer=f"{fence.owner} {fence.branch}")


def run_item(*, run_id, sid: str, task_id: str) -> str:
    """Run one item of a run's fan-out for the task its walk booked (runs.walk.fleet): take it, run the step's code
    under the item's own lease, and write its outcome into its row for the walk to journal."""
    taken = item_take(run_id=run_id, sid=sid, task_id=task_id, owner=f"{leases.worker_id()}:item")
    if taken is None:
        return "gone"  # the walk took it back, a cancel dropped it, or it was booked again for another task
    fence = taken.fence
    leases.heartbeat.track(fence)
    try:
        step = taken.step or _step_of(run_id, sid)
        run = Run(id=fence.run_id)  # what its writes name; the walk made everything else of the step already
        writer = ItemWriter(run, fence)
        key = step_key(run.id, sid, taken.attempt)
        state = StepState(attempt=taken.attempt, started=True)
        ctx = StepCapabilities(writer, step_id=sid, attempt=taken.attempt, key=key, state=state).context(
            run_id=str(run.id),
            resumed=taken.resumed,
            timeout=step.get("timeout_seconds"),
            emit=writer.emit(sid, taken.attempt),
            lease_lost=lambda: leases.heartbeat.lost(fence),
        )
        if ctx.timeout:
            ctx.deadline = time.monotonic() + float(ctx.timeout)
        take_slot = ctx.rate_limit

        def before_try(channel: str, name: str) -> list:
            # Before each try of a send: a worker frozen past its lease, whose item went elsewhere, sends nothing.
            if not item_holds(fence=fence):
                raise LeaseLost(f"item {sid} of run {run_id} is no longer this worker's")
            return take_slot(channel, name)

        ctx.rate_limit = before_try
        result: dict[str, Any]
        began = time.monotonic()
        try:
            output = step_invoke(step, ctx, context={}, fields=taken.fields)
            dumps_json({"output": output}, what=f"what step {sid} returned")  # its row would refuse it
            result = {"output": output, "extra": {**ctx.extra, "ran_on": fence.owner}}  # in its step_completed
        except Wait as exc:
            wake_at = exc.wake_at.isoformat() if exc.wake_at is not None else None
            result = {"wait": {"waiting_on": exc.waiting_on, "wake_at": wake_at, "journal": exc.journal}}
        except StepError as exc:
            result = {"error": exc.as_payload()}
        except NotJSON as exc:
            result = {"error": {"message": mask(str(exc)), "code": "internal_error", "permanent": True}}
        except (LeaseLost, FencedOut):
            return "fenced"
        except (Interrupted, *CONNECTION_ERRORS) as exc:
            # Not the item's outcome: its lease is no longer beaten, so it expires and the walk books it again.
            log.warning("run %s item %s: the database failed under it; it will be booked again: %s", run_id, sid, exc)
            return "interrupted"
        except Exception as exc:  # a bug (a DataError too) must fail the item, not wedge the run in a loop
            log.error("item %s of run %s raised", sid, run_id, exc_info=exc)
            result = {"error": StepError(f"{type(exc).__name__}: {exc}", code="internal_error").as_payload()}
        result["ms"] = round((time.monotonic() - began) * 1000, 3)
        return "done" if item_finish(fence=fence, result=result) else "fenced"
    except DatabaseError as exc:
        log.warning("run %s item %s: the database failed; its walk will book it again: %s", run_id, sid, exc)
        return "interrupted"
    finally:
        leases.heartbeat.untrack(fence)


def _step_of(run_id, sid: str) -> dict:
    """An item's step from its run's workflow (a booking made before bookings carried it)."""
    run = Run.objects.select_related("workflow").get(id=run_id)
    step_id = sid.rsplit("[", 1)[0]
    return next(step for step in run.workflow.definition["steps"] if step["id"] == step_id)

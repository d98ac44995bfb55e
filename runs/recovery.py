"""The recovery sweep (docs/reference/design.md)."""

# Works through the stuck runs (runs.selectors holds the one definition of stuck, cause by cause): a queued or
# running run with no live lease is booked for a new task with the steal-only-expired upsert (so two sweeps, or a
# sweep and a worker, never re-drive one run twice), journaled run_redriven and re-enqueued; a waiting run whose
# timer is due, or whose child moved, is woken. It never executes a run inline. A queued run is booked for its
# first task at creation, so it is only picked up once that booking expired: that is the grace period for a
# message still in the broker.

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from journal.services import NewEvent, events_append
from pal.clock import db_clock, db_clock_sql

from . import leases
from .dispatch import book_drive, booked_task_id, enqueue_bulk, enqueue_rerun, enqueue_sweep
from .models import BulkAction, BulkStatus, Rerun, RerunStatus, Run, Sweep
from .rate_limits import rate_slots_prune
from .selectors import parents_of_moved_children, stuck_lost_lease, stuck_timer_overdue
from .services import run_end_below_cancelled, run_wake, run_wake_timer
from .workflow_rollups import rollups_prune

log = logging.getLogger("pal.recovery")
BATCH = 500
BULK_OPEN = (BulkStatus.PENDING, BulkStatus.RUNNING)


def stuck_run_ids(*, now=None, limit: int = BATCH) -> list:
    """The runs the sweep re-drives (runs.selectors.stuck_lost_lease), longest unmoved first."""
    return list(stuck_lost_lease(now=now).order_by("updated_at").values_list("id", flat=True)[:limit])


def wake_parents_of_moved_children(*, limit: int = BATCH, found: list[tuple] | None = None) -> list[str]:
    """Wake each parent stuck on a moved child (and its waiting ancestors); its root's walk drives the child on or
    takes its ending. Conditional on the parent still waiting on that child, so two sweeps wake it once."""
    woken = []
    for parent_id, child_id, status, _ended in parents_of_moved_children(limit=limit) if found is None else found:
        try:
            if run_wake(
                run_id=parent_id,
                by="sweep",
                why=f"child {child_id} is {status}, no longer waiting",
                expect={"kind": "child", "child_run_id": str(child_id)},
            ):
                woken.append(str(parent_id))
        except Exception:  # one bad run must not stop the sweep for the others
            log.exception("sweep could not wake run %s", parent_id)
    return woken


def redrive_one(*, run_id, who: str, why: str, via: str = "") -> bool:
    """Book one run for a new task if nobody holds it; journal and enqueue. False: someone else won, or the run
    is below a cancelled one (ended cancelled instead)."""
    if run_end_below_cancelled(run_id=run_id, by=who):
        return False
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # A holder frozen inside one of its transactions (SIGSTOP, a long pause) keeps its row lock on
                # run_locks however long ago its lease expired: wait a moment, then leave this run to the next
                # sweep instead of stalling the sweep and every run behind it.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '1s'")
            previous = leases.lease_describe(run_id=run_id)
            fence = book_drive(run_id=run_id)
            if fence is None:
                return False
            if not Run.objects.live().filter(id=run_id).exists():
                # It ended (or parked) after the sweep listed it: its holder finished. Undo the booking.
                transaction.set_rollback(True)
                return False
            events_append(
                run_id=run_id,
                events=[
                    NewEvent(
                        "run_redriven",
                        payload={
                            "by": who,
                            "who": f"{who} ({via})" if via else who,
                            "why": why,
                            "previous_lease": previous,
                            "task_id": booked_task_id(fence),
                        },
                    )
                ],
                writer=who,
                fence=fence,
            )
    except OperationalError as exc:
        log.warning(
            "sweep left run %s: its lease row is locked by a transaction that does not end (%s)",
            run_id,
            str(exc).strip(),
        )
        return False
    return True


def wake_due_timers(*, limit: int = BATCH, due: list | None = None) -> list[str]:
    """The backstop for durable timers whose wake-up task was lost: wake waiting runs whose wake_at passed."""
    if due is None:
        due = list(stuck_timer_overdue().values_list("id", flat=True)[:limit])
    return [str(run_id) for run_id in due if run_wake_timer(run_id=run_id)]


# Seconds between a process's housekeeping passes (pruning the sweeps' history, rate slots and hourly rollups):
# each table holds minutes or hours of rows, so once a minute keeps them as small as every pass would.
HOUSEKEEPING_EVERY = 60.0
_housekept_at = [-HOUSEKEEPING_EVERY]  # this process's last one (time.monotonic())


@dataclass(frozen=True)
class Found:
    """What one look of the sweep found to act on (runs.selectors' stuck lists and the quiet jobs)."""

    stuck: list
    timers: list
    parents: list[tuple]
    bulk: list
    reruns: list

    def __bool__(self) -> bool:
        return bool(self.stuck or self.timers or self.parents or self.bulk or self.reruns)


def sweep_look() -> Found:
    """Reads only: the runs and jobs a pass acts on."""
    return Found(
        stuck=stuck_run_ids(),
        timers=list(stuck_timer_overdue().values_list("id", flat=True)[:BATCH]),
        parents=parents_of_moved_children(limit=BATCH),
        bulk=quiet_bulk_ids(),
        reruns=quiet_rerun_ids(),
    )


def sweep_once(*, who: str = "sweep") -> Sweep:
    """One pass. With nothing to do (an idle fleet's every pass) it is one transaction: its reads, its record and,
    once a HOUSEKEEPING_EVERY, the pruning; each re-drive or wake-up is a transaction of its own, one run each."""
    began = time.monotonic()
    with transaction.atomic():
        found = sweep_look()
        if not found:
            record = Sweep.objects.create(started_at=db_clock(), finished_at=db_clock(), who=who)
        if time.monotonic() - _housekept_at[0] >= HOUSEKEEPING_EVERY:
            _housekept_at[0] = time.monotonic()
            sweeps_prune(keep=settings.PAL_SWEEP_HISTORY)
            rate_slots_prune()  # here, not in the calls: a rate-limited call's commit stays as small as its count
            rollups_prune()  # /workflows/' hourly rows past what any page reads, a bounded batch a pass
    if not found:
        return record
    redriven: list[str] = []
    examined, ids = 0, found.stuck
    while True:
        examined += len(ids)
        batch = []
        for run_id in ids:
            try:
                if redrive_one(run_id=run_id, who="sweep", why="no live lease", via=who):
                    batch.append(str(run_id))
            except Exception:  # one bad run must not stop the sweep for the others
                log.exception("sweep could not re-drive run %s", run_id)
        redriven += batch
        if len(ids) < BATCH or not batch:
            break
        ids = stuck_run_ids()
    woken = wake_due_timers(due=found.timers) + wake_parents_of_moved_children(found=found.parents)
    resent = bulk_actions_resend(quiet=found.bulk)
    reruns_resend(quiet=found.reruns)
    record = Sweep.objects.create(
        started_at=db_clock(-(time.monotonic() - began)),
        finished_at=db_clock(),
        who=who,
        examined=examined,
        redriven=redriven,
        woken=woken,
        bulk_resent=resent,
    )
    if redriven:
        log.info(
            "sweep re-drove %d run(s): %s%s",
            len(redriven),
            ", ".join(redriven[:10]),
            " ..." if len(redriven) > 10 else "",
        )
    return record


def bulk_grace() -> float:
    """Seconds a pending or running bulk action may show no sign of life before the sweep sends its task again:
    a sweep's interval at least, and no less than a run's lease (a task in the broker gets as long as a drive)."""
    return max(settings.PAL_RECOVERY_INTERVAL, settings.PAL_LEASE_TTL)


def quiet_bulk_ids(*, limit: int = BATCH) -> list[int]:
    """Pending or running bulk actions that showed no sign of life for bulk_grace(): their task was lost."""
    # A running action moves updated_at at every run it applies, so a quiet one has no live task.
    cutoff = db_clock(-bulk_grace())  # updated_at is stamped by the database's clock too (runs.services.bulk_apply)
    quiet = BulkAction.objects.filter(status__in=BULK_OPEN, updated_at__lt=cutoff)
    return list(quiet.order_by("updated_at").values_list("id", flat=True)[:limit])


def bulk_actions_resend(*, quiet: list | None = None, limit: int = BATCH) -> list[int]:
    """The backstop for bulk tasks lost with the broker (a pending action) or whose worker died (a running one
    that stopped moving): set each back to pending, free of its old claim, and send its task again."""
    # If its task was only slow, its next run's commit finds its claim gone and undoes itself
    # (runs.services.bulk_apply), and the new delivery goes on from the last run counted.
    cutoff = db_clock(-bulk_grace())
    resent = []
    for bulk_id in quiet_bulk_ids(limit=limit) if quiet is None else quiet:
        try:
            with transaction.atomic():
                # Conditional on what was read: of two sweeps, or a sweep and a task that just moved, one wins.
                if BulkAction.objects.filter(id=bulk_id, status__in=BULK_OPEN, updated_at__lt=cutoff).update(
                    status=BulkStatus.PENDING, claim="", updated_at=db_clock()
                ):
                    enqueue_bulk(bulk_id=bulk_id)  # on commit
                    resent.append(bulk_id)
        except Exception:  # one bad row must not stop the sweep for the others
            log.exception("sweep could not send bulk action %s again", bulk_id)
    if resent:
        log.info("sweep sent the task of %d bulk action(s) again: %s", len(resent), ", ".join(map(str, resent)))
    return resent


def _quiet_reruns():
    cutoff = db_clock(-bulk_grace())  # next_at and updated_at are the database's clock too
    return Rerun.objects.filter(status=RerunStatus.RUNNING, updated_at__lt=cutoff, next_at__lt=cutoff)


def quiet_rerun_ids(*, limit: int = BATCH) -> list:
    """Running reruns whose next turn is past and that took none for bulk_grace(): their chain was lost."""
    return list(_quiet_reruns().order_by("updated_at").values_list("id", flat=True)[:limit])


def reruns_resend(*, quiet: list | None = None, limit: int = BATCH) -> list[str]:
    """The backstop for rerun tasks lost with the broker or with their worker (runs.services.reruns): a running
    rerun whose next turn is past and that took none for a while gets a new chain (a new claim) and its task."""
    # A chain that was only slow finds its claim gone at its next turn and stops: no turn is taken twice.
    still_quiet = _quiet_reruns()
    resent = []
    for rerun_id in quiet_rerun_ids(limit=limit) if quiet is None else quiet:
        claim = uuid.uuid4().hex
        try:
            with transaction.atomic():
                # Conditional on what was read: of two sweeps, or a sweep and a chain that just took a turn, one wins.
                if still_quiet.filter(id=rerun_id).update(claim=claim, updated_at=db_clock()):
                    enqueue_rerun(rerun_id=rerun_id, claim=claim)  # on commit
                    resent.append(str(rerun_id))
        except Exception:  # one bad row must not stop the sweep for the others
            log.exception("sweep could not send rerun %s again", rerun_id)
    if resent:
        log.info("sweep sent the task of %d rerun(s) again: %s", len(resent), ", ".join(resent))
    return resent


def sweeps_prune(*, keep: int) -> int:
    """Keep the newest `keep` sweeps (PAL_SWEEP_HISTORY): one DELETE of the rows older than the keep-th newest,
    which reads `keep` entries of the started_at index and then the range to delete (most sweeps: one row)."""
    cutoff = Sweep.objects.order_by("-started_at").values("started_at")[keep - 1 : keep]
    deleted, _ = Sweep.objects.filter(started_at__lt=Subquery(cutoff)).delete()
    return deleted


# How long after a lease's expiry the early sweep comes: the holder's last heartbeat may land just before it.
EXPIRY_MARGIN = timedelta(milliseconds=250)
# How long after a timer's wake time its run may still be waking by its own wake-up task before the look wakes it.
TIMER_GRACE = timedelta(milliseconds=500)
# While anything is held or due soon, the look comes at least this often (seconds): a timer set meanwhile is woken
# about this late when its wake-up task reaches a worker whose clock is behind its sender's.
LOOK_POLL = 1.0

_LOOK = """
SELECT {now},
  (SELECT MIN(expires_at) FROM run_locks WHERE expires_at >= {since_lease}),
  (SELECT MIN(wake_at) FROM runs WHERE wake_at >= {since_timer})
"""


def _when(value) -> datetime | None:
    """A timestamp as the driver gives it (SQLite: text in UTC) as an aware datetime."""
    if value is None or isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(str(value))
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


@dataclass(frozen=True)
class Look:
    now: datetime  # the database's clock at the look: the next look's `since`
    due: bool  # a lease expired, or a timer came due, since the last look: sweep now
    next_in: float  # seconds until the next look


def recovery_look(*, since: datetime | None) -> Look:
    """One read, all by the database's clock (pal.clock): has a lease expired or a timer come due since the last
    look (`since`, its clock; None: a first look, nothing is due), and when the next look is worth making."""
    # Two MINs over the indexes of lease expiries and wake times. The next look comes just after the soonest live
    # expiry or wake time; while anything is held or due soon, at least every LOOK_POLL; otherwise after a TTL (any
    # lease written later expires a TTL after it, so it is seen live first) or an interval, whichever is shorter.
    clock, clock_params = db_clock_sql()
    if since is None:
        (lease_since, lease_params), (timer_since, timer_params) = (clock, clock_params), (clock, clock_params)
    else:
        lease_since, lease_params = "%s", [since]
        timer_since, timer_params = "%s", [since - TIMER_GRACE]
    sql = _LOOK.format(now=clock, since_lease=lease_since, since_timer=timer_since)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*clock_params, *lease_params, *timer_params])
        row = cursor.fetchone()
    now, lease, timer = _when(row[0]), _when(row[1]), _when(row[2])
    assert now is not None  # a clock always answers
    expired = lease is not None and lease < now
    overdue = timer is not None and timer <= now - TIMER_GRACE
    idle = min(settings.PAL_LEASE_TTL, settings.PAL_RECOVERY_INTERVAL)
    soonest = [idle]
    if lease is not None:
        soonest += [LOOK_POLL, (lease + EXPIRY_MARGIN - now).total_seconds()]
    if timer is not None and not overdue:
        left = (timer + TIMER_GRACE - now).total_seconds()
        soonest += [left, LOOK_POLL] if left < idle else [left]
    return Look(now=now, due=expired or overdue, next_in=max(0.05, min(value for value in soonest if value > 0)))


class RecoveryLook:
    """The beat's look between its ticks (pal.celery.Scheduler): when a lease expired or a timer came due, it sends
    a sweep at once, which any live worker takes. Planned in the beat and by the database's clock, the early sweep
    dies with no worker and agrees with every host. A second beat only sends a second, harmless, sweep."""

    def __init__(self):
        self.since: datetime | None = None
        self.next_at = 0.0  # time.monotonic() of the next look

    def tick(self) -> float:
        """Look if it is time; seconds until the next look."""
        if not settings.PAL_SWEEP_AT_LEASE_EXPIRY:
            return LOOK_POLL * 60
        left = self.next_at - time.monotonic()
        if left > 0:
            return left
        try:
            look = recovery_look(since=self.since)
        except DatabaseError as exc:  # the database away: the regular ticks go on; look again in a moment
            log.warning("the recovery look failed (%s); looking again in %.0f s", type(exc).__name__, LOOK_POLL)
            connection.close()
            self.next_at = time.monotonic() + LOOK_POLL
            return LOOK_POLL
        self.since = look.now
        if look.due:
            enqueue_sweep()  # autocommit: sent now
        self.next_at = time.monotonic() + look.next_in
        return look.next_in

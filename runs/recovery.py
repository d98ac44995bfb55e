"""The recovery sweep (the seed's RunRecoveryLoop).

Finds queued or running runs with no live lease, books each for a new task with the steal-only-expired
upsert (so two sweeps, or a sweep and a worker, never re-drive one run twice), journals run_redriven and
re-enqueues. It never executes a run inline. A queued run is booked for its first task at creation, so it is
only picked up once that booking expired: that is the grace period for a message still in the broker.
"""

import logging

from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from journal.services import NewEvent, events_append

from . import leases
from .models import FINAL_STATUSES, Run, RunStatus, Sweep

log = logging.getLogger("pal.recovery")
BATCH = 500


def stuck_run_ids(*, now=None, limit: int = BATCH) -> list:
    """Live runs without a live lease. Reads the partial index over live runs only."""
    now = now or timezone.now()
    return list(
        Run.objects.live()
        .filter(Q(lock__isnull=True) | Q(lock__expires_at__lt=now))
        # A child is driven by its parent's walk: the sweep re-drives the parent, which adopts the child.
        # Only an orphan (its parent has ended) is re-driven on its own.
        .filter(Q(parent_run__isnull=True) | Q(parent_run__status__in=FINAL_STATUSES))
        .order_by("updated_at")
        .values_list("id", flat=True)[:limit]
    )


def redrive_one(*, run_id, who: str, why: str, via: str = "") -> bool:
    """Book one run for a new task if nobody holds it; journal and enqueue. False: someone else won."""
    from .tasks import book_drive, booked_task_id

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
                events=[NewEvent("run_redriven", payload={"by": who, "who": f"{who} ({via})" if via else who, "why": why, "previous_lease": previous, "task_id": booked_task_id(fence)})],
                writer=who,
                fence=fence,
            )
    except OperationalError as exc:
        log.warning("sweep left run %s: its lease row is locked by a transaction that does not end (%s)",
                    run_id, str(exc).strip())
        return False
    return True


def wake_due_timers(*, limit: int = BATCH) -> list[str]:
    """The backstop for durable timers whose wake-up task was lost: wake waiting runs whose wake_at passed."""
    from .services import run_wake_timer

    due = Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=timezone.now()).values_list("id", flat=True)[:limit]
    return [str(run_id) for run_id in due if run_wake_timer(run_id=run_id)]


def sweep_once(*, who: str = "sweep") -> Sweep:
    record = Sweep.objects.create(started_at=timezone.now(), who=who)
    redriven = []
    examined = 0
    while True:
        ids = stuck_run_ids()
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
    woken = wake_due_timers()
    record.finished_at = timezone.now()
    record.examined = examined
    record.redriven = redriven
    record.woken = woken
    record.save(update_fields=["finished_at", "examined", "redriven", "woken"])
    if redriven:
        log.info("sweep re-drove %d run(s): %s%s", len(redriven), ", ".join(redriven[:10]),
                 " ..." if len(redriven) > 10 else "")
    return record

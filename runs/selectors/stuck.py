"""Which runs are stuck: the one definition, cause by cause, used by the sweep, GET /runs?stuck=true, the runs
list, /ops/ and bulk actions."""

from django.db.models import F, IntegerField, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from pal.clock import db_clock

from .. import leases
from ..models import (
    FINAL_STATUSES,
    Run,
    RunQuerySet,
    RunStatus,
)
from ..waiting import WaitsInclude


def stuck_lost_lease(*, now=None) -> RunQuerySet:
    """Queued or running runs that no live lease holds, and that nothing else drives: the sweep re-drives them.

    A child is driven by its parent's walk: the sweep re-drives the parent, which adopts the child. So a child is
    here only as an orphan (its parent has ended). Reads the partial index over live runs only."""
    return (
        Run.objects.live()
        .filter(leases.without_live_lease(now=now))
        .filter(Q(parent_run__isnull=True) | Q(parent_run__status__in=FINAL_STATUSES))
        # Held back by its concurrency limit (no lease row: nothing booked it yet): a freed slot books it.
        .exclude(Q(waiting_on__kind="concurrency") & Q(lock__isnull=True))
    )


def stuck_timer_overdue(*, now=None) -> RunQuerySet:
    """Waiting runs whose durable timer is due (by the database's clock, or `now`, a value of it) and that nothing
    has woken (the sweep wakes them)."""
    return Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=now or db_clock())


def _moved_children(*, now=None, parent_id=None) -> RunQuerySet:
    """Children that a waiting parent is parked on, that no longer wait and that nothing drives: the child ended,
    or it is live with no live lease (its parent is alive, so the sweep never re-drives the child on its own)."""
    # A child that is live under a live lease of its own (an operator re-drove it) is being walked: its ending
    # wakes the parent (runs.walk.walk.Walk.finish), so the parent is not stuck. The child is the one of the step
    # attempt the parent waits on (unique per parent, step and attempt), matched in the query: the parent's one wait,
    # or any of its several (a graph's branches each parked on a child: runs.waiting).
    waited = "parent_run__waiting_on"
    first = Q(
        parent_run__waiting_on__kind="child",
        parent_step_id=KeyTextTransform("step_id", waited),
        parent_attempt=Cast(KeyTextTransform("attempt", waited), IntegerField()),
    )
    among = WaitsInclude(waited, kind="child", step_id=F("parent_step_id"), attempt=F("parent_attempt"))
    children = Run.objects.filter(parent_run__status=RunStatus.WAITING).filter(first | among)
    if parent_id is not None:
        children = children.filter(parent_run_id=parent_id)
    return (
        children.exclude(status=RunStatus.WAITING)
        .filter(Q(status__in=FINAL_STATUSES) | leases.without_live_lease(now=now))
        # Held back by its group's limit (runs.concurrency): it waits too, and a freed slot books it.
        .exclude(Q(status=RunStatus.QUEUED, waiting_on__kind="concurrency") & Q(lock__isnull=True))
    )


def parents_of_moved_children(*, now=None, limit: int = 500, parent_id=None) -> list[tuple]:
    """Waiting runs parked on a moved child (_moved_children): stuck by definition, nothing else would move them.
    Returns [(parent id, child id, child status, whether the child ended)]: the sweep's work list, and with
    parent_id the one run's `why`."""
    rows = _moved_children(now=now, parent_id=parent_id).values_list("parent_run_id", "id", "status")[:limit]
    return [(parent, child, status, status in FINAL_STATUSES) for parent, child, status in rows]


def stuck_runs(*, now=None) -> RunQuerySet:
    """Every run that is not moving and should be, whatever the cause: the union of the three lists above, which
    the sweep works through one by one (re-drive, wake the timer, wake the parent). now: a value of the database's
    clock, by default the clock itself in the statement."""
    # One IN over a UNION of the three (each a read of a small partial index), not an OR of three INs: over the OR
    # the planner walks every run newest first testing each, 4 s at a million finished runs for GET /runs?stuck.
    ids = (
        stuck_lost_lease(now=now)
        .order_by()
        .values("id")
        .union(
            stuck_timer_overdue(now=now).order_by().values("id"),
            _moved_children(now=now).order_by().values("parent_run_id"),
        )
    )
    return Run.objects.filter(id__in=ids)

"""Exact run counts for /metrics that cost what the last hour's runs cost, however many runs there are."""

# Not one GROUP BY over every run at each scrape (docs/PERFORMANCE-code.md): the runs before a
# mark are counted once into run_tallies, and a scrape adds only the runs created (runs_created_idx) or ended
# (runs_finished_idx) since the mark. A scrape that finds the mark older than EVERY moves it to LAG ago, counting the
# runs between into the tallies, under the mark's row lock (a scrape that finds it locked reads with the old mark: no
# scrape waits). The mark trails by LAG so that a run whose ending is written and committed within LAG of its
# finished_at is counted: finished_at and created_at are written in the ending's (or the creation's) own short
# transaction.
#
# An ending is counted when it happens: a failed run that is retried and ends again counts twice (its two endings),
# and a counter never goes down, as Prometheus expects of one.

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from .models import FINAL_STATUSES, Run, RunTally, RunTallyMark, Workflow

LAG = timedelta(minutes=10)
EVERY = timedelta(hours=1)

CREATED = ""  # the tally row of a workflow's created runs


def _grouped(qs: QuerySet, *fields: str) -> dict[tuple[int, str], int]:
    rows = qs.order_by().values_list(*fields).annotate(n=Count("id"))
    return {(row[0], row[1] if len(fields) > 1 else CREATED): row[-1] for row in rows}


def _counted(*, since: datetime | None, until: datetime | None = None) -> dict[tuple[int, str], int]:
    """{(workflow id, status or CREATED): runs} created, or ended, at or after since and before until."""
    created = Run.objects.all()
    ended = Run.objects.filter(status__in=FINAL_STATUSES, finished_at__isnull=False)
    if since is not None:
        created, ended = created.filter(created_at__gte=since), ended.filter(finished_at__gte=since)
    if until is not None:
        created, ended = created.filter(created_at__lt=until), ended.filter(finished_at__lt=until)
    return {**_grouped(created, "workflow_id"), **_grouped(ended, "workflow_id", "status")}


def tally_advance(*, now: datetime | None = None) -> bool:
    """Move the mark to now - LAG when it is older than EVERY (or was never set), adding the runs in between to the
    tallies. Returns whether it moved; False also when another scrape holds the mark."""
    now = now or timezone.now()
    RunTallyMark.objects.bulk_create([RunTallyMark(id=1)], ignore_conflicts=True)
    with transaction.atomic():
        mark = RunTallyMark.objects.select_for_update(skip_locked=True).filter(id=1).first()
        if mark is None or (mark.upto is not None and mark.upto > now - EVERY):
            return False
        until = now - LAG
        found = _counted(since=mark.upto, until=until)
        if found:
            kept = {(t.workflow_id, t.status): t.n for t in RunTally.objects.all()}
            RunTally.objects.bulk_create(
                [RunTally(workflow_id=w, status=s, n=kept.get((w, s), 0) + n) for (w, s), n in found.items()],
                update_conflicts=True,
                unique_fields=["workflow", "status"],
                update_fields=["n"],
            )
        mark.upto = until
        mark.save(update_fields=["upto"])
    return True


def _tallied() -> tuple[datetime | None, dict[tuple[int, str], int]]:
    """The mark and the tallies, read in one statement (one snapshot): a mark moved meanwhile by another scrape is
    seen together with the tallies it wrote, or not at all."""
    mark, tallies = RunTallyMark._meta.db_table, RunTally._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT NULL, NULL, NULL, upto FROM {mark} WHERE id = 1 "
            f"UNION ALL SELECT workflow_id, status, n, NULL FROM {tallies}"
        )
        rows = cursor.fetchall()
    upto = next((row[3] for row in rows if row[0] is None), None)
    if isinstance(upto, str):  # SQLite's raw rows
        upto = datetime.fromisoformat(upto)
    if upto is not None and timezone.is_naive(upto):
        upto = timezone.make_aware(upto, UTC)
    return upto, {(row[0], row[1]): row[2] for row in rows if row[0] is not None}


def run_counts(*, now: datetime | None = None) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """(runs created by workflow name, runs ended by (workflow name, final status)), every version of a workflow
    together: exact, from the tallies and the runs since their mark."""
    tally_advance(now=now)
    upto, tallies = _tallied()
    recent = _counted(since=upto) if upto is not None else _counted(since=None)
    if upto is None:
        tallies = {}
    names = dict(Workflow.objects.values_list("id", "name"))
    created: dict[str, int] = {}
    finished: dict[tuple[str, str], int] = {}
    for source in (tallies, recent):
        for (workflow_id, status), n in source.items():
            name = names.get(workflow_id)
            if name is None or not n:
                continue
            if status == CREATED:
                created[name] = created.get(name, 0) + n
            else:
                finished[(name, status)] = finished.get((name, status), 0) + n
    return created, finished

"""/workflows/' numbers at any size: each workflow's runs rolled up by the UTC hour they were created in,
counted once."""

# A row (workflow name, hour) holds the runs created in that hour: how many, and of those that ended, how many by final
# status, their cost and their durations in a histogram of log-spaced buckets (RATIO wide: a percentile read from it
# is within one bucket, about 5 %, of percentile_cont over the durations themselves; the durations are kept as well
# while a row holds EXACT_UP_TO or fewer, and then the percentile is exact). The rows count the runs created, or
# ended, before a mark; a read adds the runs created since the mark (runs_created_idx) and those ended since it
# (runs_finished_idx), so /workflows/ reads 24 rows per workflow and the last few minutes' runs, however many runs the
# table holds.
#
# The mark moves when a read finds it older than LAG + STEP, to LAG ago, under its row lock: the holder folds the runs
# in between into the rows, and a read that finds the row locked reads with the old mark (no read waits, and no run is
# counted twice: the rows and the mark are read in one statement, so they are of one snapshot). Nothing is written when
# a run ends. The mark trails by LAG so that a run whose ending is committed within LAG of its finished_at is counted;
# the first mark counts from the start of the hour a day before (`since`), the oldest hour /workflows/ reads.
#
# An ending is counted when it is folded: a run that ended, was folded, then redriven and ended again counts both
# endings (as runs.tallies does); a run redriven before its first ending was folded counts once.

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

from django.db import connection, transaction
from django.db.models import Count, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone

from .models import FINAL_STATUSES, Run, Workflow, WorkflowHourRollup, WorkflowRollupMark
from .spend import runs_spend

HOUR = timedelta(hours=1)
LAG = timedelta(minutes=2)  # how far the mark trails now: an ending is committed within it of its finished_at
STEP = timedelta(seconds=30)  # how much older than LAG the mark may grow before a read moves it
HORIZON_HOURS = 24  # the hours the first mark counts: the current one and the 23 before

SMALLEST = 0.001  # seconds: bucket 0 holds every duration below it
RATIO = 1.05  # bucket n >= 1 holds [SMALLEST * RATIO**(n-1), SMALLEST * RATIO**n)
EXACT_UP_TO = 32  # durations a row keeps as they are (beyond, only the histogram)
COST_CHUNK = 1_000  # runs whose journal one query reads for their cost


# --- durations ------------------------------------------------------------------------------------


def bucket_of(seconds: float) -> int:
    if seconds < SMALLEST:
        return 0
    return 1 + math.floor(math.log(seconds / SMALLEST) / math.log(RATIO))


def bucket_value(bucket: int) -> float:
    """A bucket's geometric middle: within sqrt(RATIO) of every duration it holds."""
    if bucket <= 0:
        return SMALLEST / 2
    return SMALLEST * RATIO ** (bucket - 0.5)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Postgres' percentile_cont: linear interpolation between the two nearest ranks of the sorted values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def histogram_percentile(histogram: dict[int, int], fraction: float) -> float | None:
    """percentile_cont over the histogram: the two nearest ranks are taken as their buckets' middles, so the answer
    is within one bucket (a factor sqrt(RATIO) each way) of percentile_cont over the durations themselves."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = fraction * (total - 1)
    low, high = int(rank), min(int(rank) + 1, total - 1)
    values: dict[int, float] = {}
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        for wanted in (low, high):
            if wanted not in values and wanted < seen:
                values[wanted] = bucket_value(bucket)
        if high in values:
            break
    return values[low] + (values[high] - values[low]) * (rank - low)


def dense(histogram: dict[int, int]) -> list[int]:
    """A histogram as a row stores it: [first bucket, its runs, the next bucket's runs, ...] ([] when empty); a
    list of small numbers reads back several times faster than an object keyed by bucket."""
    if not histogram:
        return []
    low, high = min(histogram), max(histogram)
    return [low, *(histogram.get(bucket, 0) for bucket in range(low, high + 1))]


# --- what a set of runs adds up to ----------------------------------------------------------------


@dataclass
class Figures:
    """Runs created, and of those that ended: by final status, cost, durations (histogram; the durations
    themselves, or None once there are more than a row keeps)."""

    created: int = 0
    ended: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    histogram: dict[int, int] = field(default_factory=dict)
    durations: list[float] | None = field(default_factory=list)

    def add(self, other: "Figures", *, keep_up_to: int | None = None) -> None:
        self.created += other.created
        for status, n in other.ended.items():
            self.ended[status] = self.ended.get(status, 0) + n
        self.cost_usd = round(self.cost_usd + other.cost_usd, 10)
        for bucket, n in other.histogram.items():
            self.histogram[bucket] = self.histogram.get(bucket, 0) + n
        if self.durations is None or other.durations is None:
            self.durations = None
        else:
            self.durations = self.durations + other.durations
            if keep_up_to is not None and len(self.durations) > keep_up_to:
                self.durations = None

    def add_row(self, row: WorkflowHourRollup) -> None:
        """Add a row's figures (its histogram as stored: dense)."""
        self.add(
            Figures(created=row.created, ended=row.ended, cost_usd=row.cost_usd, histogram={}, durations=row.durations)
        )
        if row.histogram:
            low, counts = row.histogram[0], row.histogram[1:]
            histogram = self.histogram
            for offset, n in enumerate(counts):
                if n:
                    histogram[low + offset] = histogram.get(low + offset, 0) + n

    def end(self, *, status: str, seconds: float | None, cost: float) -> None:
        self.ended[status] = self.ended.get(status, 0) + 1
        self.cost_usd = round(self.cost_usd + cost, 10)
        if seconds is not None:
            bucket = bucket_of(seconds)
            self.histogram[bucket] = self.histogram.get(bucket, 0) + 1
            if self.durations is not None:
                self.durations.append(seconds)

    def duration_percentile(self, fraction: float) -> float | None:
        if self.durations is not None:
            return percentile(self.durations, fraction)
        return histogram_percentile(self.histogram, fraction)


def run_costs(
    runs: Sequence[tuple[uuid.UUID, int]], *, definitions: dict[int, dict] | None = None
) -> dict[uuid.UUID, float]:
    """Each run's own cost in dollars by the one rule of spend (runs.spend), from (run id, workflow id) pairs: the
    definitions of the few versions (read here unless given) say which steps can spend, and the journal is read by
    its (run_id, seq) key for those steps (and their items) of the runs that have any."""
    if definitions is None:
        definitions = dict(Workflow.objects.filter(id__in={w for _, w in runs}).values_list("id", "definition"))
    spent = runs_spend({run_id: definitions.get(workflow_id) for run_id, workflow_id in runs})
    return {run_id: spend.cost_usd for run_id, spend in spent.items()}


def _hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def runs_figures(
    *,
    since: datetime,
    created_from: datetime | None = None,
    ended_from: datetime | None = None,
    until: datetime | None = None,
    versions: dict[int, tuple[str, dict]] | None = None,
) -> dict[tuple[str, datetime], Figures]:
    """{(workflow name, hour created): Figures} of the runs created at or after since, read from the runs: those
    created at or after created_from (counted as created) and those that ended at or after ended_from (counted as
    ended), both before until when given; of these versions ({id: (name, definition)}) when given, else of all."""
    if versions is None:
        versions = {i: (name, d) for i, name, d in Workflow.objects.values_list("id", "name", "definition")}
    names = {workflow_id: name for workflow_id, (name, _) in versions.items()}
    definitions = {workflow_id: definition for workflow_id, (_, definition) in versions.items()}
    out: dict[tuple[str, datetime], Figures] = {}

    def figures(workflow_id: int, hour: datetime) -> Figures:
        return out.setdefault((names[workflow_id], _hour(hour)), Figures())

    created: QuerySet = Run.objects.filter(created_at__gte=max(since, created_from or since))
    ended: QuerySet = Run.objects.filter(status__in=FINAL_STATUSES, finished_at__isnull=False, created_at__gte=since)
    if ended_from is not None:
        ended = ended.filter(finished_at__gte=ended_from)
    if until is not None:
        created, ended = created.filter(created_at__lt=until), ended.filter(finished_at__lt=until)
    created, ended = created.filter(workflow_id__in=list(names)), ended.filter(workflow_id__in=list(names))
    for workflow_id, hour, n in (
        created.annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .order_by()
        .values_list("workflow_id", "hour")
        .annotate(n=Count("*"))
    ):
        figures(workflow_id, hour).created += n
    rows = ended.order_by().values_list("id", "workflow_id", "created_at", "status", "started_at", "finished_at")
    # A fold streams its runs; a read's few runs since the mark come in one round trip, without a server cursor.
    rows_iter = rows.iterator(chunk_size=COST_CHUNK) if until is not None else iter(list(rows))
    while chunk := list(islice(rows_iter, COST_CHUNK)):
        costs = run_costs([(row[0], row[1]) for row in chunk], definitions=definitions)
        for run_id, workflow_id, created_at, status, started, finished in chunk:
            seconds = (finished - started).total_seconds() if started else None
            figures(workflow_id, created_at).end(status=status, seconds=seconds, cost=costs.get(run_id, 0.0))
    return out


# --- the mark and the rows ------------------------------------------------------------------------


def rollup_advance(*, now: datetime | None = None) -> bool:
    """Move the mark to now - LAG when it is older than LAG + STEP (or was never set), folding the runs in between
    into the rows. Returns whether it moved; False also when another read holds the mark."""
    now = now or timezone.now()
    until = now - LAG
    upto = WorkflowRollupMark.objects.filter(id=1).values_list("upto", flat=True).first()
    if upto is not None and upto > until - STEP:  # fresh: read on, without taking the row's lock
        return False
    WorkflowRollupMark.objects.bulk_create([WorkflowRollupMark(id=1)], ignore_conflicts=True)
    with transaction.atomic():
        mark = WorkflowRollupMark.objects.select_for_update(skip_locked=True).filter(id=1).first()
        if mark is None or (mark.upto is not None and mark.upto > until - STEP):
            return False
        if mark.upto is None or mark.since is None:
            mark.since = _hour(now) - (HORIZON_HOURS - 1) * HOUR
        found = runs_figures(since=mark.since, created_from=mark.upto, ended_from=mark.upto, until=until)
        if found:
            kept = {
                (row.name, row.hour): row
                for row in WorkflowHourRollup.objects.filter(hour__in={hour for _, hour in found})
            }
            rows = []
            for (name, hour), figures in found.items():
                total = Figures()
                if (name, hour) in kept:
                    total.add_row(kept[(name, hour)])
                total.add(figures, keep_up_to=EXACT_UP_TO)
                rows.append(
                    WorkflowHourRollup(
                        name=name,
                        hour=hour,
                        created=total.created,
                        ended=total.ended,
                        cost_usd=total.cost_usd,
                        histogram=dense(total.histogram),
                        durations=total.durations,
                    )
                )
            WorkflowHourRollup.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["hour", "name"],
                update_fields=["created", "ended", "cost_usd", "histogram", "durations"],
            )
        mark.upto = until
        mark.save(update_fields=["since", "upto"])
    return True


def _json(value):
    """A JSON column as a raw row gives it (text with psycopg 3 under Django, and on SQLite)."""
    return json.loads(value) if isinstance(value, str) else value


def _aware(value) -> datetime:
    if isinstance(value, str):  # SQLite's raw rows
        value = datetime.fromisoformat(value)
    return timezone.make_aware(value, UTC) if timezone.is_naive(value) else value


def _rolled(*, since: datetime, names: list[str]) -> tuple[datetime | None, datetime | None, list[WorkflowHourRollup]]:
    """The mark (since, upto) and the rows of these workflows from hour `since` on, read in one statement (one
    snapshot): a mark moved meanwhile by another read is seen together with the rows it wrote, or not at all."""
    mark, rollups = WorkflowRollupMark._meta.db_table, WorkflowHourRollup._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT m.since, m.upto, r.name, r.hour, r.created, r.ended, r.cost_usd, r.histogram, r.durations "
            f"FROM {mark} m LEFT JOIN {rollups} r ON r.hour >= %s AND r.name IN ({', '.join(['%s'] * len(names))}) "
            f"WHERE m.id = 1",
            [since, *names],
        )
        found = cursor.fetchall()
    if not found:
        return None, None, []
    rows = []
    for _, _, name, hour, created, ended, cost, histogram, durations in found:
        if name is None:
            continue
        rows.append(
            WorkflowHourRollup(
                name=name,
                hour=_aware(hour),
                created=created,
                cost_usd=cost,
                ended=_json(ended),
                histogram=_json(histogram),
                durations=_json(durations),
            )
        )
    first, upto = found[0][0], found[0][1]
    return (_aware(first) if first is not None else None), (_aware(upto) if upto is not None else None), rows


# The rows' sums by (database, mark, first hour, workflows), kept by each process: the rows change only when the mark
# moves (in the same commit), so a sum read for one mark stays exact until the mark moves, about every STEP.
_SUMS: dict[tuple, tuple[datetime | None, datetime | None, dict[str, Figures]]] = {}
_SUMS_KEPT = 8


def _rows_summed(*, start: datetime, names: list[str]) -> tuple[datetime | None, datetime | None, dict[str, Figures]]:
    """The mark (since, upto) and each workflow's rows from hour `start` on, added up: from _SUMS when the mark is
    the one they were read with, else read (mark and rows in one snapshot) and kept."""
    first, upto = WorkflowRollupMark.objects.filter(id=1).values_list("since", "upto").first() or (None, None)
    key = (connection.alias, connection.settings_dict.get("NAME"), start, tuple(names))
    kept = _SUMS.get(key)
    if kept is not None and upto is not None and kept[:2] == (first, upto):
        return kept
    first, upto, rows = _rolled(since=start, names=names)
    sums = {name: Figures() for name in names}
    for row in rows:
        sums[row.name].add_row(row)
    while len(_SUMS) >= _SUMS_KEPT:
        _SUMS.pop(next(iter(_SUMS)))
    _SUMS[key] = (first, upto, sums)
    return first, upto, sums


def window_figures(*, names: Sequence[str], now: datetime | None = None, hours: int = 24) -> dict[str, Figures]:
    """{workflow name: Figures} of the runs created in the current UTC hour and the `hours` - 1 before (every
    version of a workflow together): from the rows and the runs since the mark, or, when the rows do not reach
    that far back (or were never made), from the runs themselves."""
    now = now or timezone.now()
    start = _hour(now) - (hours - 1) * HOUR
    out = {name: Figures() for name in names}
    if not names:
        return out
    rollup_advance(now=now)
    since, upto, sums = _rows_summed(start=start, names=sorted(names))
    versions = {
        i: (name, definition)
        for i, name, definition in Workflow.objects.filter(name__in=list(names)).values_list("id", "name", "definition")
    }
    if upto is None or since is None or since > start:
        recent = runs_figures(since=start, versions=versions)
    else:
        recent = runs_figures(since=start, created_from=upto, ended_from=upto, versions=versions)
        for name, figures in sums.items():
            out[name].add(figures)
    for (name, _), figures in recent.items():
        if name in out:
            out[name].add(figures)
    return out


# --- pruning --------------------------------------------------------------------------------------

# Rows older than this are deleted by the sweep. /workflows/ reads the last HORIZON_HOURS; the rest is a margin (a
# page asked for a longer window reads the runs themselves once the mark's `since` is past its start).
KEEP = timedelta(days=8)
PRUNE_BATCH = 1_000  # rows one sweep deletes at most: its commit stays small however far behind it is


def rollups_prune(*, now: datetime | None = None, keep: timedelta = KEEP, batch: int = PRUNE_BATCH) -> int:
    """Delete the oldest rows of hours more than `keep` ago, at most `batch` of them (the sweep calls it, once per
    pass). In the same commit the mark's `since` moves up to that hour, so the mark never says the rows count hours
    whose rows are gone: its row lock keeps a fold out meanwhile (a read then reads with the mark it found). Returns
    how many rows went."""
    cutoff = _hour(now or timezone.now()) - keep
    with transaction.atomic():
        WorkflowRollupMark.objects.filter(id=1, since__lt=cutoff).update(since=cutoff)
        # The oldest first, by the (hour, name) unique index: a range read of at most `batch` entries.
        old = WorkflowHourRollup.objects.filter(hour__lt=cutoff).order_by("hour", "name")
        ids = list(old.values_list("id", flat=True)[:batch])
        deleted, _ = WorkflowHourRollup.objects.filter(id__in=ids).delete() if ids else (0, {})
    return deleted

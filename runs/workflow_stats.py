"""What the workflow pages read: per workflow (by name, all its versions) and per time window, how many runs,
how they ended, how long they took and what they cost."""

# /workflows/' numbers (workflow_summaries) come from hourly rollups and the runs since their mark
# (runs.workflow_rollups): every run of the window counted, whatever the table's size. The charts of one workflow are
# keyed by workflow and window, so each is an index range (runs_workflow_created_idx) and never a scan of all runs.
# Duration is finished_at - started_at of the runs that ended; the charts' percentiles are percentile_cont in SQL on
# Postgres and the same linear interpolation in Python elsewhere (SQLite), over at most MAX_DURATIONS runs there.
# Cost is what runs.selectors.run_usage_rollup counts (the usage of llm_call and agent steps' step_completed, once
# per attempt); the cost per day reads at most MAX_COST_RUNS of a day's newest runs.

import difflib
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, F, FloatField, Func, QuerySet
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from .models import Run, RunStatus, Workflow
from .selectors import workflow_list_latest
from .workflow_rollups import percentile, run_costs, window_figures

DAY = timedelta(hours=24)
MAX_DURATIONS = 20_000  # runs a window's percentiles read on a database without percentile_cont
MAX_COST_RUNS = 1_000  # a window's newest runs of a workflow whose journal the cost reads


# --- percentiles ----------------------------------------------------------------------------------


class _PercentileCont(Aggregate):
    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, *, fraction: float):
        super().__init__(expression, fraction=float(fraction))


def _seconds():
    """finished_at - started_at in seconds (Postgres)."""
    return Func(
        F("finished_at"),
        F("started_at"),
        template="EXTRACT(EPOCH FROM (%(expressions)s))",
        arg_joiner=" - ",
        output_field=FloatField(),
    )


def _durations_by(runs: QuerySet, key: str) -> dict:
    """{key value: (p50, p95)} of the ended runs, grouped by key (a field or an annotation of runs)."""
    ended = runs.filter(started_at__isnull=False, finished_at__isnull=False)
    if connection.vendor == "postgresql":
        rows = ended.values(key).annotate(
            p50=_PercentileCont(_seconds(), fraction=0.5), p95=_PercentileCont(_seconds(), fraction=0.95)
        )
        return {row[key]: (row["p50"], row["p95"]) for row in rows.order_by()}
    seconds: dict = defaultdict(list)
    for group, started, finished in ended.order_by("-created_at").values_list(key, "started_at", "finished_at")[
        :MAX_DURATIONS
    ]:
        seconds[group].append((finished - started).total_seconds())
    return {group: (percentile(v, 0.5), percentile(v, 0.95)) for group, v in seconds.items()}


# --- cost -----------------------------------------------------------------------------------------


def _newest(runs: QuerySet) -> list[tuple[uuid.UUID, int]]:
    """(id, workflow id) of the newest MAX_COST_RUNS runs."""
    return list(runs.order_by("-created_at", "-id").values_list("id", "workflow_id")[:MAX_COST_RUNS])


# --- the list: every workflow ---------------------------------------------------------------------


def _runs_of(name: str) -> QuerySet:
    """The runs of every version of a workflow, by the versions' ids: an index range on
    runs_workflow_created_idx per version once a window is added (a join on the name lets the planner walk
    every workflow's runs by time instead)."""
    return Run.objects.filter(workflow_id__in=list(Workflow.objects.filter(name=name).values_list("id", flat=True)))


def _window(runs: QuerySet, *, since: datetime, until: datetime) -> QuerySet:
    return runs.filter(created_at__gte=since, created_at__lt=until)


def workflow_summaries(*, names: Iterable[str] | None = None, now: datetime | None = None, window: timedelta = DAY):
    """The latest version of each workflow (of names, or all) with the numbers of its runs created in the window
    (whole UTC hours: the current one and those before it, 24 for a day): runs, succeeded, ended, success_rate
    (succeeded of the ended runs), p50_s and p95_s of the ended runs' durations (exact while few, else within a
    bucket, about 5 %: runs.workflow_rollups), cost_per_run (their cost over the ended runs) and cost_runs; a
    figure over the ended runs is None when none ended. Read from hourly rollups and the runs since their mark."""
    now = now or timezone.now()
    latest = workflow_list_latest()
    latest = latest.filter(name__in=list(names)) if names is not None else latest
    workflows = {workflow.name: workflow for workflow in latest}
    figures = window_figures(names=list(workflows), now=now, hours=max(1, int(window / timedelta(hours=1))))
    summaries = []
    for name, workflow in workflows.items():
        found = figures[name]
        ended = sum(found.ended.values())
        succeeded = found.ended.get(RunStatus.SUCCEEDED, 0)
        summaries.append(
            {
                "name": name,
                "workflow": workflow,
                "runs": found.created,
                "succeeded": succeeded,
                "ended": ended,
                "success_rate": succeeded / ended if ended else None,
                "p50_s": found.duration_percentile(0.5),
                "p95_s": found.duration_percentile(0.95),
                "cost_per_run": found.cost_usd / ended if ended else None,
                "cost_runs": ended,
            }
        )
    return summaries


# --- one workflow over time -----------------------------------------------------------------------


def _hour_starts(now: datetime, hours: int) -> list[datetime]:
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    return [this_hour - timedelta(hours=hours - 1 - i) for i in range(hours)]


def runs_by_status_per_hour(*, name: str, now: datetime | None = None, hours: int = 24) -> list[dict]:
    """[{start, counts: {status: n}}] for each of the last `hours` hours (the current one last), by creation."""
    now = now or timezone.now()
    starts = _hour_starts(now, hours)
    rows = (
        _window(_runs_of(name), since=starts[0], until=now)
        .annotate(hour=TruncHour("created_at"))
        .values("hour", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    buckets: dict[datetime, dict[str, int]] = {start: {} for start in starts}
    for row in rows:
        buckets.setdefault(row["hour"], {})[row["status"]] = row["n"]
    return [{"start": start, "counts": buckets[start]} for start in starts]


def durations_per_hour(*, name: str, now: datetime | None = None, hours: int = 24) -> list[dict]:
    """[{start, p50_s, p95_s}] of the runs created in each of the last `hours` hours that ended (None: none)."""
    now = now or timezone.now()
    starts = _hour_starts(now, hours)
    runs = _window(_runs_of(name), since=starts[0], until=now).annotate(hour=TruncHour("created_at"))
    found = _durations_by(runs, "hour")
    return [
        {"start": s, "p50_s": found.get(s, (None, None))[0], "p95_s": found.get(s, (None, None))[1]} for s in starts
    ]


def cost_per_day(*, name: str, now: datetime | None = None, days: int = 14) -> list[dict]:
    """[{start, cost_usd, runs}] for each of the last `days` days (UTC, today last): the cost of the runs created
    that day (of at most MAX_COST_RUNS runs per day) and how many runs were created."""
    now = now or timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    starts = [today - timedelta(days=days - 1 - i) for i in range(days)]
    runs = _runs_of(name)
    window = _window(runs, since=starts[0], until=now)
    created = {
        row["day"]: row["n"]
        for row in window.annotate(day=TruncDay("created_at")).values("day").annotate(n=Count("id")).order_by()
    }
    out = []
    for start in starts:
        newest = _newest(_window(runs, since=start, until=start + DAY)) if created.get(start) else []
        cost = sum(run_costs(newest).values()) if newest else 0.0
        out.append({"start": start, "cost_usd": round(cost, 10), "runs": created.get(start, 0)})
    return out


# --- versions -------------------------------------------------------------------------------------


def definition_diff(older: Workflow, newer: Workflow) -> list[dict]:
    """A unified diff of two versions' definitions as indented JSON with sorted keys, line by line:
    [{text, change: "+", "-", "@" (a hunk's head) or " "}]; [] when they are the same."""

    def lines(w: Workflow) -> list[str]:
        return json.dumps(w.definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    diff = difflib.unified_diff(
        lines(older), lines(newer), fromfile=f"v{older.version}", tofile=f"v{newer.version}", lineterm="", n=3
    )
    out = []
    for text in diff:
        change = "@" if text.startswith(("@@", "---", "+++")) else (text[:1] if text[:1] in "+-" else " ")
        out.append({"text": text, "change": change})
    return out

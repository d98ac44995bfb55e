"""What the workflow pages read: per workflow (by name, all its versions) and per time window, how many runs,
how they ended, how long they took and what they cost.

Every read is keyed by workflow and window, so it is an index range (runs_workflow_created_idx, or
runs_created_idx for the list of every workflow) and never a scan of all runs. Duration is finished_at -
started_at of the runs that ended; percentiles are percentile_cont in SQL on Postgres and the same linear
interpolation in Python elsewhere (SQLite), over at most MAX_DURATIONS runs there. Cost is what
runs.selectors.run_usage_rollup counts (the usage of llm_call and agent steps' step_completed, once per attempt),
read for at most MAX_COST_RUNS of the window's newest runs of a workflow: "cost per run" is their mean.
"""

import difflib
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, F, FloatField, Func, Q, QuerySet
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from journal.models import JournalEvent
from journal.receipts import USAGE_KINDS, usage_of

from .models import FINAL_STATUSES, Run, RunStatus, Workflow
from .selectors import workflow_list_latest

DAY = timedelta(hours=24)
MAX_DURATIONS = 20_000  # runs a window's percentiles read on a database without percentile_cont
MAX_COST_RUNS = 1_000  # a window's newest runs of a workflow whose journal the cost reads


# --- percentiles ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Postgres' percentile_cont: linear interpolation between the two nearest ranks of the sorted values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


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


def run_costs(runs: Sequence[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, float]:
    """Each run's cost in dollars, as run_usage_rollup counts a run's own usage, from (run id, workflow id)
    pairs: the definitions of the few versions say which steps have usage, and the journal is read by its
    (run_id, seq) key for those steps of the runs that have any."""
    usage_steps = {
        workflow_id: {
            s.get("id")
            for s in (definition or {}).get("steps", [])
            if isinstance(s, dict) and s.get("kind") in USAGE_KINDS
        }
        for workflow_id, definition in Workflow.objects.filter(id__in={w for _, w in runs}).values_list(
            "id", "definition"
        )
    }
    steps_of = {run_id: usage_steps.get(workflow_id, set()) for run_id, workflow_id in runs}
    costs = dict.fromkeys(steps_of, 0.0)
    costly = [run_id for run_id, steps in steps_of.items() if steps]
    if not costly:
        return costs
    rows = JournalEvent.objects.filter(
        run_id__in=costly, kind="step_completed", step_id__in=set().union(*usage_steps.values())
    ).values_list(
        "run_id",
        "step_id",
        "attempt",
        "payload__output__usage__prompt_tokens",
        "payload__output__usage__completion_tokens",
        "payload__output__cost_usd",
    )
    seen = set()
    for run_id, step_id, attempt, prompt, completion, cost in rows:
        if step_id not in steps_of[run_id] or (run_id, step_id, attempt) in seen:
            continue
        seen.add((run_id, step_id, attempt))
        usage = {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}, "cost_usd": cost}
        costs[run_id] = round(costs[run_id] + usage_of(usage)[2], 10)
    return costs


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
    """The latest version of each workflow (of names, or all) with its window's numbers: runs, succeeded, ended,
    success_rate (succeeded of the ended runs; None when none ended), p50_s and p95_s (None when none ended),
    cost_per_run (None without runs) and cost_runs (how many runs the cost was read from)."""
    now = now or timezone.now()
    since = now - window
    latest = workflow_list_latest()
    latest = latest.filter(name__in=list(names)) if names is not None else latest
    workflows = {workflow.name: workflow for workflow in latest}
    in_window = _window(Run.objects.filter(workflow__name__in=list(workflows)), since=since, until=now)
    counts = {
        row["workflow__name"]: row
        for row in in_window.values("workflow__name")
        .annotate(
            runs=Count("id"),
            succeeded=Count("id", filter=Q(status=RunStatus.SUCCEEDED)),
            ended=Count("id", filter=Q(status__in=FINAL_STATUSES)),
        )
        .order_by()
    }
    durations = _durations_by(in_window, "workflow__name")
    summaries = []
    for name, workflow in workflows.items():
        row = counts.get(name, {"runs": 0, "succeeded": 0, "ended": 0})
        p50, p95 = durations.get(name, (None, None))
        newest = _newest(_window(_runs_of(name), since=since, until=now)) if row["runs"] else []
        costs = run_costs(newest) if newest else {}
        summaries.append(
            {
                "name": name,
                "workflow": workflow,
                "runs": row["runs"],
                "succeeded": row["succeeded"],
                "ended": row["ended"],
                "success_rate": row["succeeded"] / row["ended"] if row["ended"] else None,
                "p50_s": p50,
                "p95_s": p95,
                "cost_per_run": sum(costs.values()) / len(costs) if costs else None,
                "cost_runs": len(costs),
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

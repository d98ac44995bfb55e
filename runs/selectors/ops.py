"""What the operator's pages read beyond lists: ancestors, trees and their spend, what waits on an operator, the
status counts, the sweeps, a bulk action."""

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Q

from pal.clock import db_now

from .. import leases
from ..errors import NotFound
from ..models import (
    FINAL_STATUSES,
    BulkAction,
    Run,
    RunStatus,
    SideEffect,
    SideEffectStatus,
    Sweep,
)
from ..spend import NOTHING, runs_spend
from ..spend import total as spend_total
from ..waiting import PendingApproval, WaitsInclude, approvals_of
from .lists import lease_of


def cancelled_ancestor(run_id) -> Any:
    """The id of the run's nearest cancelled ancestor, or None: a run below a cancelled one is never driven (the
    sweep and the walk end it cancelled instead: runs.services.run_end_below_cancelled)."""
    parent_id = Run.objects.filter(id=run_id).values_list("parent_run_id", flat=True).first()
    for _ in range(100):  # PAL_MAX_CHILD_DEPTH bounds a tree far below this; a cycle in forged rows must not loop
        if parent_id is None:
            return None
        row = Run.objects.filter(id=parent_id).values_list("status", "parent_run_id").first()
        if row is None:
            return None
        if row[0] == RunStatus.CANCELLED:
            return parent_id
        parent_id = row[1]
    return None


def run_tree_ids(run: Run) -> list:
    """The run and all its descendants, root first: one query per level (depth is at most PAL_MAX_CHILD_DEPTH)."""
    ids, frontier = [run.id], [run.id]
    while frontier:
        frontier = list(Run.objects.filter(parent_run_id__in=frontier).values_list("id", flat=True))
        ids += frontier
    return ids


def run_usage_rollup(run: Run, *, tree_ids: list | None = None) -> dict:
    """Tokens and cost of the run alone and of the run with all its descendants, by the one rule of spend
    (runs.spend: items counted, a fork's reused steps not), read lean: the tree's workflow definitions in one query,
    the usage fields of its step_completed rows in another. The run page's header and budgets use it."""
    tree_ids = tree_ids or run_tree_ids(run)
    definitions = dict(Run.objects.filter(id__in=tree_ids).values_list("id", "workflow__definition"))
    spent = runs_spend(definitions)
    own = spent.get(run.id, NOTHING).as_dict()
    total = spend_total(spent.values()).as_dict()
    return {"own": own, "total": total, "runs": len(tree_ids)}


def budgets_pending(*, limit: int = 200) -> list[Run]:
    """Runs waiting on a reached budget (an operator raises it or cancels the run), oldest first."""
    qs = Run.objects.select_related("workflow").filter(status=RunStatus.WAITING, waiting_on__kind="budget")
    return list(qs.order_by("updated_at")[:limit])


def approvals_pending(*, run_ids: list | None = None, limit: int = 200) -> list[PendingApproval]:
    """Every approval that waiting runs wait on (of the given runs only, e.g. a run's tree), oldest run first: a
    graph's run may wait on several at once, one each (runs.waiting). A parent waiting on such a child waits on a
    child, not on an approval: the decision goes to the child, whose wake-up walks up."""
    asks = Q(waiting_on__kind="approval") | WaitsInclude("waiting_on", kind="approval")
    qs = Run.objects.select_related("workflow").filter(asks, status=RunStatus.WAITING)
    if run_ids is not None:
        qs = qs.filter(id__in=run_ids)
    return [item for run in qs.order_by("updated_at")[:limit] for item in approvals_of(run)][:limit]


def side_effects_open(*, limit: int = 200) -> list[dict]:
    """Claimed-but-unconfirmed side effects (status claimed or unconfirmed), oldest first, each with whether a
    live lease holds its run now (then its worker may be sending it: it is in flight, not stuck)."""
    now = db_now()
    rows = (
        SideEffect.objects.select_related("run", "run__workflow", "run__lock")
        .filter(status__in=(SideEffectStatus.CLAIMED, SideEffectStatus.UNCONFIRMED))
        .order_by("claimed_at")[:limit]
    )
    out = []
    for effect in rows:
        lease = lease_of(effect.run)
        in_flight = (
            effect.status == SideEffectStatus.CLAIMED
            and effect.run.status not in FINAL_STATUSES
            and lease is not None
            and leases.lease_live(lease["expires_at"], now=now)
        )
        out.append({"effect": effect, "run": effect.run, "in_flight": in_flight})
    return out


# The dashboard counts this many finished runs of a status exactly; past it, it shows an estimate.
EXACT_FINISHED_UP_TO = 1000


def status_counts() -> dict[str, dict]:
    """How many runs are in each status (every status, zeros included): {status: {"n", "exact", "shown"}}."""
    # It costs what the unfinished runs cost, however many runs have finished (the dashboard polls it). One query:
    # queued, running and waiting runs are counted exactly over the status index's entries for them alone, and
    # each finished status over at most EXACT_FINISHED_UP_TO + 1 entries of that index (newest first). Past that,
    # Postgres's planner estimates the number ("about", from the statistics autovacuum keeps: one EXPLAIN, however
    # big the table). Not a cache: it would still count every finished run at each expiry; not a counter table:
    # every run's ending would then write one hot row.
    unfinished = [status for status in RunStatus.values if status not in FINAL_STATUSES]
    table = Run._meta.db_table
    placeholders = ", ".join(["%s"] * len(unfinished))
    sql = " UNION ALL ".join(
        [f"SELECT status, count(*) FROM {table} WHERE status IN ({placeholders}) GROUP BY status"]
        + [
            f"SELECT status, count(*) FROM (SELECT status FROM {table} WHERE status = %s ORDER BY created_at DESC "
            "LIMIT %s) AS finished GROUP BY status"
        ]
        * len(FINAL_STATUSES)
    )
    params = [*unfinished, *(p for status in FINAL_STATUSES for p in (status, EXACT_FINISHED_UP_TO + 1))]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = dict(cursor.fetchall())
    past = [status for status in FINAL_STATUSES if found.get(status, 0) > EXACT_FINISHED_UP_TO]
    estimates = _planner_rows_each(past) if past and connection.vendor == "postgresql" else {}
    counts = {}
    for status in RunStatus.values:
        n = found.get(status, 0)
        if status not in past:
            counts[status] = {"n": n, "exact": True, "shown": str(n)}
        elif status in estimates:
            about = max(estimates[status], n)
            counts[status] = {"n": about, "exact": False, "shown": f"≈ {about:,}"}
        else:
            counts[status] = {"n": EXACT_FINISHED_UP_TO, "exact": False, "shown": f"{EXACT_FINISHED_UP_TO:,}+"}
    return counts


def _planner_rows_each(statuses: Sequence[str]) -> dict[str, int]:
    """How many runs of each status Postgres's planner expects (its statistics, not the rows): one EXPLAIN of
    a UNION ALL, whose branches the plan lists in order."""
    branches = [Run.objects.filter(status=status).order_by().values("id") for status in statuses]
    # order_by() on the union too: else it takes Run's default ordering, a column the branches do not select.
    query = branches[0].union(*branches[1:], all=True).order_by() if len(branches) > 1 else branches[0]
    plan = json.loads(query.explain(format="json"))[0]["Plan"]
    parts = plan["Plans"] if len(branches) > 1 else [plan]
    return {status: int(part["Plan Rows"]) for status, part in zip(statuses, parts, strict=True)}


def sweeps_recent(*, limit: int = 5) -> list[Sweep]:
    return list(Sweep.objects.order_by("-started_at")[:limit])


def sweep_last_redrive(*, within: int = 1000) -> Sweep | None:
    """The latest of the last `within` sweeps that re-drove anything (most passes re-drive nothing)."""
    for sweep in Sweep.objects.only("started_at", "redriven").order_by("-started_at")[:within]:
        if sweep.redriven:
            return sweep
    return None


def bulk_get(*, bulk_id: int):
    bulk = BulkAction.objects.filter(id=bulk_id).first()
    if bulk is None:
        raise NotFound(f"bulk action {bulk_id} does not exist", code="bulk_not_found")
    return bulk

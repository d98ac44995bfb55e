"""What reads: lists, one run with its lease and why it is not moving, the waterfall, a re-drive preview,
health. Views, the API and the pages call these; nothing here changes state."""

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from journal.receipts import usage_of
from journal.selectors import event_rows_for_run, last_event, waterfall_bars

from . import leases
from .models import FINAL_STATUSES, Run, RunStatus, SideEffect, SideEffectStatus, Sweep, Workflow
from .recovery import parents_of_moved_children
from .services import ServiceError

# --- workflows ------------------------------------------------------------------------------------


def workflow_list_latest():
    """The latest version of every workflow, by name."""
    latest = Workflow.objects.filter(name=OuterRef("name")).order_by("-version").values("version")[:1]
    return Workflow.objects.filter(version=Subquery(latest)).order_by("name")


def workflow_versions(*, name: str):
    return Workflow.objects.filter(name=name).order_by("-version")


# --- run lists ------------------------------------------------------------------------------------

MAX_PAGE = 200


class InvalidCursor(ServiceError):
    status = 422


def cursor_encode(run: Run) -> str:
    raw = json.dumps([run.created_at.isoformat(), str(run.id)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, run_id = json.loads(raw)
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("naive time")
        return when, uuid.UUID(run_id)
    except (binascii.Error, ValueError, TypeError, AttributeError, UnicodeDecodeError):
        raise InvalidCursor(
            "cursor is not one this API gave out; start again without it", code="invalid_cursor"
        ) from None


def stuck_runs(*, now=None):
    """Queued or running runs that no live lease holds: the sweep's work list (runs.recovery)."""
    now = now or timezone.now()
    return Run.objects.live().filter(Q(lock__isnull=True) | Q(lock__expires_at__lt=now))


def run_list(
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent: uuid.UUID | None = None,
    stuck: bool = False,
    limit: int = 50,
    cursor: str | None = None,
    q: str | None = None,
) -> tuple[list[Run], str | None]:
    """Newest first, keyset-paginated on (created_at, id): a page stays right while new runs arrive (they
    come before the first page) and no page counts the table. Returns (runs, next cursor or None).
    q (the pages' search box): a run id, or the start of one."""
    qs = stuck_runs() if stuck else Run.objects.all()
    if q:
        qs = qs.id_matches(q)
    if status:
        qs = qs.filter(status=status)
    if workflow:
        qs = qs.filter(workflow__name=workflow)
    if parent:
        qs = qs.filter(parent_run_id=parent)
    if cursor:
        created, run_id = cursor_decode(cursor)
        qs = qs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id))
    limit = max(1, min(limit, MAX_PAGE))
    runs = list(qs.select_related("workflow", "lock").order_by("-created_at", "-id")[: limit + 1])
    more = len(runs) > limit
    runs = runs[:limit]
    return runs, (cursor_encode(runs[-1]) if more and runs else None)


def lease_of(run: Run) -> dict | None:
    """{owner, epoch, expires_at} of the run's lease, or None. Uses the lock a list read with select_related."""
    fields_cache = run._state.fields_cache
    if "lock" in fields_cache:
        lock = fields_cache["lock"]
        return {"owner": lock.owner, "epoch": lock.epoch, "expires_at": lock.expires_at} if lock else None
    described = leases.lease_describe(run_id=run.id)
    if described is None:
        return None
    expires = datetime.fromisoformat(described["expires_at"])
    if timezone.is_naive(expires):  # SQLite's raw rows carry no zone; they are UTC
        expires = timezone.make_aware(expires, UTC)
    return {**described, "expires_at": expires}


# --- why a run is not moving ----------------------------------------------------------------------


def _ago(moment: datetime, now: datetime) -> str:
    seconds = (now - moment).total_seconds()
    if seconds < 0:
        return f"in {-seconds:.0f}s"
    return f"{seconds:.0f}s ago"


def _at(moment) -> str:
    return moment.isoformat(timespec="seconds") if isinstance(moment, datetime) else str(moment)


def _waiting_sentence(run: Run) -> str:
    waiting = run.waiting_on
    if isinstance(waiting, dict):
        kind = waiting.get("kind")
        if kind == "approval":
            return f"waiting on the approval of step {waiting.get('step_id')!r}"
        if kind == "signal":
            return f"waiting on the signal {waiting.get('name')!r}" + (
                f" (step {waiting['step_id']!r})" if waiting.get("step_id") else ""
            )
        if kind in ("timer", "sleep"):
            until = waiting.get("until") or run.wake_at
            return f"waiting on a timer until {_at(until)}" if until else "waiting on a timer"
        if kind in ("child", "child_run"):
            child = waiting.get("child_run_id") or waiting.get("run_id")
            text = f"waiting on child run {child} (step {waiting.get('step_id')!r})"
            inner = waiting.get("child_waiting_on")
            if isinstance(inner, dict) and inner:
                text += ", which is " + _waiting_sentence(Run(waiting_on=inner, wake_at=None))
            return text
    if waiting:
        return f"waiting on {json.dumps(waiting, default=str)}"
    if run.wake_at:
        return f"waiting until {_at(run.wake_at)}"
    return "waiting, but it does not say on what (waiting_on is empty)"


_UNSET: Any = object()


def _moved_child(run: Run, *, now: datetime) -> str | None:
    """For a run parked on a child that no longer waits and that nothing drives (the sweep's rule,
    runs.recovery.parents_of_moved_children): the child's state in words; else None."""
    if not isinstance(run.waiting_on, dict) or run.waiting_on.get("kind") != "child":
        return None
    for _parent, _child, status, ended in parents_of_moved_children(now=now, limit=1, parent_id=run.id):
        return status if ended else f"{status} with no live lease"
    return None


def run_why(run: Run, *, lease: dict | None = _UNSET, now: datetime | None = None) -> str | None:
    """In words, why a run that has not ended is not moving (or what it is doing); None for an ended run."""
    if run.status in FINAL_STATUSES:
        return None
    now = now or timezone.now()
    if run.status == RunStatus.WAITING:
        moved = _moved_child(run, now=now)
        if moved:
            return (
                f"{_waiting_sentence(run)}, but that child is {moved} and nothing drives it, so this run is "
                f"stuck: the recovery sweep wakes it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
            )
        return _waiting_sentence(run)
    if lease is _UNSET:
        lease = lease_of(run)
    sweep = f"the recovery sweep re-drives it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
    if lease is None:
        if run.status == RunStatus.QUEUED:
            return f"queued with no lease and no task booked for it: {sweep}"
        return f"no lease: no worker holds it and no task is booked for it; {sweep}"
    owner, epoch, expires = lease["owner"], lease["epoch"], lease["expires_at"]
    expired = expires < now
    if owner.startswith("task:"):
        task = owner.removeprefix("task:")
        if expired:
            return (
                f"its booking for task {task} (epoch {epoch}) expired at {_at(expires)} ({_ago(expires, now)}) "
                f"and no worker took it (the message was lost or no worker runs): {sweep}"
            )
        last = last_event(run_id=run.id)
        if last is not None and last.kind == "run_backoff":
            return (
                f"backing off before the next attempt of step {last.step_id!r}: booked for task {task} "
                f"(epoch {epoch}), due {_at((last.payload or {}).get('until') or expires)}"
            )
        return (
            f"queued for task {task} (epoch {epoch}): waiting for a worker to take it; if none does by "
            f"{_at(expires)}, {sweep}"
        )
    if expired:
        return (
            f"lease expired: held by {owner} (epoch {epoch}), expired at {_at(expires)} ({_ago(expires, now)}) "
            f"without a heartbeat, so that worker has probably died; {sweep}"
        )
    last = last_event(run_id=run.id)
    doing = ""
    if last is not None and last.kind == "step_started":
        doing = f", inside step {last.step_id!r} (attempt {last.attempt}) since {_at(last.created_at)}"
    elif last is not None and last.step_id:
        doing = f", last event {last.kind} of step {last.step_id!r} at {_at(last.created_at)}"
    return f"held by {owner} (epoch {epoch}) until {_at(expires)}{doing}"


# --- waterfall and re-drive preview ---------------------------------------------------------------


def run_waterfall(run: Run) -> list[dict]:
    return waterfall_bars(run_id=run.id)


def redrive_preview(run: Run) -> dict:
    """What a re-drive would do now: the steps it reuses (with the tokens and cost that saves), the steps it
    runs (again, under the same attempt and key when one had started), and the side effects it would claim
    again (webhooks, sent again with the same Idempotency-Key) or leave to an operator (unconfirmed email)."""
    from .executor import MISSING, replay
    from .workflows import step_policy

    states = replay(event_rows_for_run(run_id=run.id))
    reused, rerun = [], []
    saved = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
    for step in run.workflow.definition.get("steps", []):
        state = states.get(step["id"])
        if state is not None and state.output is not MISSING:
            prompt, completion, cost = usage_of(state.output)
            reused.append(
                {
                    "step_id": step["id"],
                    "kind": step.get("kind"),
                    "attempt": state.attempt,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "cost_usd": cost,
                }
            )
            saved["prompt_tokens"] += prompt
            saved["completion_tokens"] += completion
            saved["cost_usd"] = round(saved["cost_usd"] + cost, 10)
            continue
        attempt, resumes = 1, False
        if state is not None:
            attempt = state.attempt
            if state.failure is not None:
                max_attempts, _ = step_policy(step)
                attempt = state.attempt + 1 if state.attempt < max_attempts else state.attempt
            else:
                resumes = state.started
        rerun.append({"step_id": step["id"], "kind": step.get("kind"), "attempt": attempt, "resumes": resumes})
    effects = []
    open_statuses = (SideEffectStatus.CLAIMED, SideEffectStatus.UNCONFIRMED)
    for effect in SideEffect.objects.filter(run_id=run.id, status__in=open_statuses).order_by("claimed_at"):
        if effect.status == SideEffectStatus.UNCONFIRMED:
            action = "left to an operator: it may have been sent before a crash and is not sent again"
        elif effect.channel == "webhook":
            action = "claimed, never confirmed: sent again with the same Idempotency-Key (the receiver dedups)"
        else:
            action = "claimed, never confirmed: not sent again; marked unconfirmed for an operator"
        effects.append(
            {
                "key": effect.key,
                "step_id": effect.step_id,
                "attempt": effect.attempt,
                "channel": effect.channel,
                "target": effect.target,
                "status": effect.status,
                "on_redrive": action,
            }
        )
    lease = lease_of(run)
    live = lease is not None and lease["expires_at"] >= timezone.now()
    return {
        "run_id": run.id,
        "status": run.status,
        "can_redrive": run.status not in FINAL_STATUSES,
        "needs_force": live,
        "lease": lease,
        "reused": reused,
        "rerun": rerun,
        "side_effects": effects,
        "saved": saved,
    }


# --- health ---------------------------------------------------------------------------------------


# The workers' side of /health: beat sends a sweep every PAL_RECOVERY_INTERVAL and a worker runs it, so a last
# sweep older than a few intervals means no beat, no worker, or workers that cannot reach the database.
SWEEP_STALE_INTERVALS = 3
SWEEP_STALE_MARGIN_SECONDS = 10.0


def health() -> dict[str, Any]:
    """{database, broker, sweep, last_sweep_at, problems}: "ok" or what is wrong with each, and a sentence per
    problem. sweep is "ok", "stale" (older than SWEEP_STALE_INTERVALS intervals plus a margin), "none" (no sweep
    has finished yet: a new installation, nothing to judge by) or "unknown" (the database does not answer)."""
    problems = []
    database = "ok"
    sweep = "unknown"
    last_sweep_at = None
    try:
        last_sweep_at = _database_check()
    except Exception as exc:  # any failure means the same: the database does not answer
        database = "error"
        problems.append(f"database: {type(exc).__name__}: {exc}")
    else:
        sweep, problem = _sweep_check(last_sweep_at)
        if problem:
            problems.append(problem)
    broker = "ok"
    try:
        _broker_ping()
    except Exception as exc:
        broker = "error"
        problems.append(f"broker: {type(exc).__name__}: {exc}")
    return {
        "database": database,
        "broker": broker,
        "sweep": sweep,
        "last_sweep_at": last_sweep_at,
        "problems": problems,
    }


def _database_check() -> datetime | None:
    """A round trip on a connection known to be alive; returns when the last sweep finished."""
    if not connection.in_atomic_block:
        # A kept connection may have died with a Postgres restart: health-check it (or replace it) first, so the
        # answer is the database's now, never an error of a stale connection (nor an "ok" remembered from before).
        connection.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return (
        Sweep.objects.filter(finished_at__isnull=False)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )


def _sweep_check(last_sweep_at: datetime | None) -> tuple[str, str | None]:
    if last_sweep_at is None:
        return "none", None
    interval = settings.PAL_RECOVERY_INTERVAL
    limit = SWEEP_STALE_INTERVALS * interval + SWEEP_STALE_MARGIN_SECONDS
    age = (timezone.now() - last_sweep_at).total_seconds()
    if age <= limit:
        return "ok", None
    return "stale", (
        f"sweep: the last recovery sweep finished {age:.0f}s ago (PAL_RECOVERY_INTERVAL is "
        f"{interval:g}s, stale after {limit:g}s): is celery beat running, and do the workers reach "
        f"the database?"
    )


def _broker_ping(timeout: float = 2.0) -> None:
    from pal.celery import app

    with app.connection_for_write(settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        if conn.transport.driver_type == "redis":
            conn.default_channel.client.ping()


# --- the operator's pages -------------------------------------------------------------------------


def run_state_line(run: Run, *, lease: dict | None, now: datetime) -> str:
    """The run list's one line of state, from what the list read already (its lease by select_related): no
    query per row, so unlike run_why it does not look at the journal."""
    if run.status == RunStatus.WAITING:
        moved = _moved_child(run, now=now)
        if moved:
            return (
                f"{_waiting_sentence(run)}, but that child is {moved} and nothing drives it, so this run is "
                f"stuck: the recovery sweep wakes it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
            )
        return _waiting_sentence(run)
    if run.status in LIVE_STATUSES_SET:
        if lease is None:
            return "no lease: the sweep will re-drive it"
        left = (lease["expires_at"] - now).total_seconds()
        booked = lease["owner"].startswith("task:")
        if left < 0:
            if booked:
                return f"booked for a task that no worker took; the booking expired {-left:.0f}s ago"
            return f"lease of {lease['owner']} (epoch {lease['epoch']}) expired {-left:.0f}s ago: its worker died?"
        if booked:
            return f"queued for a worker (booking expires in {left:.0f}s)"
        return f"held by {lease['owner']} (epoch {lease['epoch']}), expires in {left:.0f}s"
    if run.status == RunStatus.FAILED and isinstance(run.error, dict):
        return f"{run.error.get('step_id') or ''}: {run.error.get('message') or run.error.get('code') or ''}"
    return ""


LIVE_STATUSES_SET = frozenset((RunStatus.QUEUED, RunStatus.RUNNING))


def run_tree_ids(run: Run) -> list:
    """The run and all its descendants, root first: one query per level (depth is at most PAL_MAX_CHILD_DEPTH)."""
    ids, frontier = [run.id], [run.id]
    while frontier:
        frontier = list(Run.objects.filter(parent_run_id__in=frontier).values_list("id", flat=True))
        ids += frontier
    return ids


def run_usage_rollup(run: Run, *, tree_ids: list | None = None) -> dict:
    """Tokens and cost of the run alone and of the run with all its descendants, counted as the receipt counts
    them (the usage of llm_call and agent steps' outputs; a child_run step's output is its child's, counted in
    the child) but read lean: the usage fields of step_completed events in one query, the step kinds from the
    tree's workflow definitions in another. The run page's header shows it on every refresh."""
    from journal.models import JournalEvent
    from journal.receipts import USAGE_KINDS

    tree_ids = tree_ids or run_tree_ids(run)
    usage_steps: set[tuple] = set()
    for run_id, definition in Run.objects.filter(id__in=tree_ids).values_list("id", "workflow__definition"):
        usage_steps.update(
            (run_id, s.get("id"))
            for s in (definition or {}).get("steps", [])
            if isinstance(s, dict) and s.get("kind") in USAGE_KINDS
        )
    rows = JournalEvent.objects.filter(run_id__in=tree_ids, kind="step_completed").values_list(
        "run_id",
        "step_id",
        "attempt",
        "payload__output__usage__prompt_tokens",
        "payload__output__usage__completion_tokens",
        "payload__output__cost_usd",
    )
    own = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
    total = dict(own)
    seen = set()
    for run_id, step_id, attempt, prompt, completion, cost in rows:
        if (run_id, step_id) not in usage_steps or (run_id, step_id, attempt) in seen:
            continue
        seen.add((run_id, step_id, attempt))
        prompt, completion, cost = usage_of(
            {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}, "cost_usd": cost}
        )
        for bucket in (total, own) if run_id == run.id else (total,):
            bucket["prompt_tokens"] += prompt
            bucket["completion_tokens"] += completion
            bucket["cost_usd"] = round(bucket["cost_usd"] + cost, 10)
    for bucket in (own, total):
        bucket["tokens"] = bucket["prompt_tokens"] + bucket["completion_tokens"]
    return {"own": own, "total": total, "runs": len(tree_ids)}


def approvals_pending(*, run_ids: list | None = None, limit: int = 200) -> list[Run]:
    """Runs waiting on an approval (of the given runs only, e.g. a run's tree), oldest first. A parent waiting on
    such a child waits on a child, not on an approval: the decision goes to the child, whose wake-up walks up."""
    qs = Run.objects.select_related("workflow").filter(status=RunStatus.WAITING, waiting_on__kind="approval")
    if run_ids is not None:
        qs = qs.filter(id__in=run_ids)
    return list(qs.order_by("updated_at")[:limit])


STUCK_CAUSES = {
    "lease_expired": "lease expired: its worker stopped heartbeating (probably died)",
    "booking_expired": "booked for a task nobody took (the message was lost, or no worker runs)",
    "no_lease": "no lease and no task booked",
    "timer_overdue": "a durable timer is due and has not woken it",
    "child_moved": "parked on a child that no longer waits and that nothing drives",
}


def stuck_runs_grouped(*, limit: int = 500, now: datetime | None = None) -> list[dict]:
    """Runs that are not moving and should be, grouped by why: [{cause, label, runs: [{run, lease, why}]}].
    Live runs without a live lease (what the sweep re-drives) and waiting runs whose timer is overdue. One
    query each; why is worded from the lease read with the run."""
    now = now or timezone.now()
    groups: dict[str, list] = {cause: [] for cause in STUCK_CAUSES}
    for run in stuck_runs(now=now).select_related("workflow", "lock").order_by("updated_at")[:limit]:
        lease = lease_of(run)
        if lease is None:
            cause = "no_lease"
        elif lease["owner"].startswith("task:"):
            cause = "booking_expired"
        else:
            cause = "lease_expired"
        groups[cause].append({"run": run, "lease": lease, "why": run_why(run, lease=lease, now=now)})
    overdue = (
        Run.objects.select_related("workflow")
        .filter(status=RunStatus.WAITING, wake_at__lt=now)
        .order_by("wake_at")[:limit]
    )
    for run in overdue:
        groups["timer_overdue"].append({"run": run, "lease": None, "why": run_why(run, now=now)})
    parents = [moved[0] for moved in parents_of_moved_children(now=now, limit=limit)]
    for run in Run.objects.select_related("workflow").filter(id__in=parents).order_by("updated_at"):
        groups["child_moved"].append({"run": run, "lease": None, "why": run_why(run, now=now)})
    return [{"cause": cause, "label": STUCK_CAUSES[cause], "runs": runs} for cause, runs in groups.items() if runs]


def side_effects_open(*, limit: int = 200) -> list[dict]:
    """Claimed-but-unconfirmed side effects (status claimed or unconfirmed), oldest first, each with whether a
    live lease holds its run now (then its worker may be sending it: it is in flight, not stuck)."""
    now = timezone.now()
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
            and lease["expires_at"] >= now
        )
        out.append({"effect": effect, "run": effect.run, "in_flight": in_flight})
    return out


# The dashboard counts this many finished runs of a status exactly; past it, it shows an estimate.
EXACT_FINISHED_UP_TO = 1000


def status_counts() -> dict[str, dict]:
    """How many runs are in each status (every status, zeros included): {status: {"n", "exact", "shown"}}.

    It costs what the unfinished runs cost, however many runs have finished (the dashboard polls it). One query:
    queued, running and waiting runs are counted exactly over the status index's entries for them alone, and
    each finished status over at most EXACT_FINISHED_UP_TO + 1 entries of that index (newest first). Past that,
    Postgres's planner estimates the number ("about", from the statistics autovacuum keeps: one EXPLAIN, however
    big the table). Not a cache: it would still count every finished run at each expiry; not a counter table:
    every run's ending would then write one hot row."""
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
    query = branches[0].union(*branches[1:], all=True) if len(branches) > 1 else branches[0]
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
    from .models import BulkAction

    bulk = BulkAction.objects.filter(id=bulk_id).first()
    if bulk is None:
        raise ServiceError(f"bulk action {bulk_id} does not exist", code="bulk_not_found", status=404)
    return bulk

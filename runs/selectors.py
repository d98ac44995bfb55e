"""What reads: lists, which runs are stuck, one run's lease, the waterfall, a re-drive preview, health. Views, the
API, the pages and the sweep call these; nothing here changes state. The words about a run (why it is not moving,
its state line) are in runs.explain."""

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, IntegerField, OuterRef, Q, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from journal.models import JournalEvent
from journal.selectors import replay_rows_for_run, waterfall_bars
from pal import db_away, rows
from pal.celery import app
from pal.clock import db_clock, db_now

from . import input_terms, leases, search
from .errors import NotFound, ServiceError
from .models import (
    FINAL_STATUSES,
    BulkAction,
    Run,
    RunLock,
    RunQuerySet,
    RunStatus,
    SideEffect,
    SideEffectStatus,
    Sweep,
    Workflow,
)
from .replay import MISSING, item_id, replay
from .spend import NOTHING, attempt_spend, runs_spend
from .spend import total as spend_total
from .waiting import PendingApproval, WaitsInclude, approvals_of
from .workflows import step_policy

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


# --- stuck: the one definition, used by the sweep, GET /runs?stuck=true, the runs list, /ops/ and bulk actions --


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


def runs_matching(
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent=None,
    ids=None,
    q: str | None = None,
    stuck: bool = False,
    input: dict | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    error_code: str | None = None,
    input_after: tuple[datetime, Any] | None = None,
) -> RunQuerySet:
    """The runs that the list filters name (GET /runs, the runs page, a bulk action's set), unordered.
    input: runs whose input contains this object (jsonb @>); created_after (inclusive) and created_before
    (exclusive): a half-open window, so two adjacent windows share no run; error_code: runs.error->>'code'.
    Each is index-backed on Postgres (runs.search; `input` by runs.input_terms where the probe has a term, which
    input_after, a list's cursor, bounds)."""
    qs = stuck_runs() if stuck else Run.objects.all()
    if q:
        qs = qs.id_matches(q)
    if input:
        narrowed = input_terms.narrowed(qs, input, after=input_after)
        qs = narrowed.filter(search.input_contains(input, indexed=narrowed is qs))
    if created_after:
        qs = qs.filter(created_at__gte=created_after)
    if created_before:
        qs = qs.filter(created_at__lt=created_before)
    if error_code:
        qs = qs.filter(search.error_code_is(error_code))
    if status:
        qs = qs.filter(status=status)
    if workflow:
        # The versions' ids first (a small read): over a join on the name the planner cannot tell a rare workflow
        # from a common one, and at a million runs walks the newest-first index past all the others.
        qs = qs.filter(workflow_id__in=list(Workflow.objects.filter(name=workflow).values_list("id", flat=True)))
    if parent:
        qs = qs.filter(parent_run_id=parent)
    if ids:
        qs = qs.filter(id__in=list(ids))
    return qs


_LIST_DEFERS = ("workflow__definition", "workflow__description")


@contextmanager
def _planned_for_its_values():
    """A list's statement planned for the values it filters on (a custom plan, not the generic plan Postgres keeps
    for a statement prepared under PAL_DB_PREPARE), for this statement's transaction only (SET LOCAL)."""
    # The connection prepares a statement it has sent five times (PAL_DB_PREPARE), and Postgres then keeps one
    # generic plan for every value: for `workflow_id IN ($1)` ordered by created_at, the walk of the newest-first
    # index that suits a common workflow, which passes thousands of others to fill a rare workflow's page
    # (docs/PERFORMANCE-code.md). The engine's own statements, whose plans do not depend on
    # their values, keep their generic plans.
    if connection.vendor != "postgresql" or connection.settings_dict["OPTIONS"].get("prepare_threshold") is None:
        yield
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        yield


def run_list(
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent: uuid.UUID | None = None,
    stuck: bool = False,
    limit: int = 50,
    cursor: str | None = None,
    q: str | None = None,
    input: dict | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    error_code: str | None = None,
) -> tuple[list[Run], str | None]:
    """Newest first, keyset-paginated on (created_at, id): a page stays right while new runs arrive (they
    come before the first page) and no page counts the table. Returns (runs, next cursor or None).
    q (the pages' search box): a run id, or the start of one. input, created_after, created_before, error_code:
    as runs_matching (runs.search reads them from text)."""
    after = cursor_decode(cursor) if cursor else None
    qs = runs_matching(
        status=status,
        workflow=workflow,
        parent=parent,
        q=q,
        stuck=stuck,
        input=input,
        created_after=created_after,
        created_before=created_before,
        error_code=error_code,
        input_after=after,
    )
    if after:
        created, run_id = after
        # created_at <= as well: the OR alone is no index bound, and the newest-first walk would pass every run
        # newer than the cursor (50,000 of them 1,000 runs deep at a million) before the page's first.
        qs = qs.filter(Q(created_at__lte=created), Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id))
    limit = max(1, min(limit, MAX_PAGE))
    order = input_terms.ORDER if input and input_terms.terms_of(input) else ("-created_at", "-id")
    # The workflow's definition stays behind: a list shows its name and version, and decoding each row's copy of
    # the definition was most of a 50-run page's time.
    with _planned_for_its_values():
        runs = list(qs.select_related("workflow", "lock").defer(*_LIST_DEFERS).order_by(*order)[: limit + 1])
    more = len(runs) > limit
    runs = runs[:limit]
    return runs, (cursor_encode(runs[-1]) if more and runs else None)


# The journal's last row comes along only when `why` reads it (a queued or running run that a lease holds or a
# booking waits on: explain.run_why); else it is None, read or not. One index probe of the journal's key.
_RUN_WITH_LEASE = rows.Read(
    Run,
    "r",
    joined={"workflow": "w", "lock": "l"},
    attached={"last_event": (JournalEvent, "e")},
    # The database's clock, read with the row (no round trip of its own): `why` judges the lease by it (pal.clock).
    # A datetime on Postgres; SQLite's text is left unused (one machine: its clock is the local one).
    extra={"db_now": "CURRENT_TIMESTAMP"},
    tail="FROM runs r JOIN workflows w ON w.id = r.workflow_id LEFT JOIN run_locks l ON l.run_id = r.id "
    f"LEFT JOIN {JournalEvent._meta.db_table} e ON l.run_id IS NOT NULL "
    f"AND r.status IN ('{RunStatus.QUEUED.value}', '{RunStatus.RUNNING.value}') AND e.run_id = r.id "
    f"AND e.seq = (SELECT MAX(m.seq) FROM {JournalEvent._meta.db_table} m WHERE m.run_id = r.id) "
    "WHERE r.id = %s",
)


def run_with_lease(*, run_id) -> Run:
    """The run with its workflow, its lease (lease_of reads it from there) and, when `why` needs it, its last
    journal row (run.last_event) in one read built once: what GET /runs/{id} answers, its busiest read. NotFound
    like services.run_get."""
    try:
        run = _RUN_WITH_LEASE.one([Run._meta.pk.get_db_prep_value(run_id, connection)])
    except (ValueError, ValidationError):  # not a run id
        run = None
    if run is None:
        raise NotFound(f"run {run_id} does not exist", code="run_not_found")
    return run


def lease_of(run: Run) -> dict | None:
    """{owner, epoch, expires_at} of the run's lease, or None. Uses the lock a list read with select_related."""
    fields_cache = run._state.fields_cache
    if "lock" in fields_cache:
        lock = fields_cache["lock"]
        return {"owner": lock.owner, "epoch": lock.epoch, "expires_at": lock.expires_at} if lock else None
    described, clock = leases.lease_describe_with_clock(run_id=run.id)
    if described is None:
        return None
    if isinstance(clock, datetime):
        run.db_now = clock  # type: ignore[attr-defined]  # the lease's judge, read with it (runs.api.run_out)
    expires = datetime.fromisoformat(described["expires_at"])
    if timezone.is_naive(expires):  # SQLite's raw rows carry no zone; they are UTC
        expires = timezone.make_aware(expires, UTC)
    return {**described, "expires_at": expires}


def leases_cache(runs: Sequence[Run]) -> None:
    """Read the leases of these runs in one query and cache each on its run, where lease_of finds it (None: no
    lease), as select_related("lock") leaves them: POST /runs/batch's answer, one read for all its runs."""
    # The database's clock in the same read (run_out judges the leases by it: no second round trip for it).
    clock = db_clock()  # an expression on Postgres (read with the rows), the local clock's value on SQLite
    rows = RunLock.objects.filter(run_id__in=[run.id for run in runs])
    if hasattr(clock, "resolve_expression"):
        rows = rows.annotate(clock=clock)
    locks = {lock.run_id: lock for lock in rows}
    if hasattr(clock, "resolve_expression"):
        clock = next((lock.clock for lock in locks.values()), None)  # type: ignore[attr-defined]
    for run in runs:
        Run.lock.related.set_cached_value(run, locks.get(run.id))
        if clock is not None:
            run.db_now = clock  # type: ignore[attr-defined]


# --- waterfall and re-drive preview ---------------------------------------------------------------


def run_waterfall(run: Run) -> list[dict]:
    return waterfall_bars(run_id=run.id)


def redrive_preview(run: Run) -> dict:
    """What a re-drive would do now: the steps it reuses (with the tokens and cost that saves), the steps it
    runs (again, under the same attempt and key when one had started), and the side effects it would claim
    again (webhooks, sent again with the same Idempotency-Key) or leave to an operator (unconfirmed email)."""
    # A graph's steps the same way: a skipped step is reused (its `when` is not evaluated again), and each item of
    # a for_each step ("{step}[{index}]", with item_of and index) is reused or runs on its own; the for_each step
    # itself is reused once every item was, and saves nothing of its own (its output is its items' outputs).
    states = replay(replay_rows_for_run(run_id=run.id))
    steps = run.workflow.definition.get("steps", [])
    fan_outs = [step["id"] for step in steps if "for_each" in step]
    counts = {}  # a for_each step's number of items, journaled when its items began (its step_started)
    if fan_outs:
        started = JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id__in=fan_outs)
        for step_id, count in started.order_by("seq").values_list("step_id", "payload__items"):
            counts[step_id] = count
    reused, rerun = [], []
    saved = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}

    def reuse(step, sid, state, *, usage=True, **extra):
        spent = attempt_spend(step, state.output) if usage else NOTHING  # the one rule of spend (runs.spend)
        prompt, completion, cost = spent.prompt_tokens, spent.completion_tokens, spent.cost_usd
        reused.append(
            {
                "step_id": sid,
                "kind": step.get("kind"),
                "attempt": None if state.skipped else state.attempt,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "cost_usd": cost,
                **({"skipped": True} if state.skipped else {}),
                **extra,
            }
        )
        saved["prompt_tokens"] += prompt
        saved["completion_tokens"] += completion
        saved["cost_usd"] = round(saved["cost_usd"] + cost, 10)

    def run_again(step, sid, state, **extra):
        attempt, resumes = 1, False
        if state is not None:
            attempt = state.attempt
            if state.failure is not None:
                max_attempts, _ = step_policy(step)
                attempt = state.attempt + 1 if state.attempt < max_attempts else state.attempt
            else:
                resumes = state.started
        rerun.append({"step_id": sid, "kind": step.get("kind"), "attempt": attempt, "resumes": resumes, **extra})

    def fan_out(step, state):
        """A for_each step, then each of its items on its own. The step saves nothing of its own: its output is
        the list of its items' outputs, whose usage the items count."""
        count = counts.get(step["id"])
        count = count if isinstance(count, int) and not isinstance(count, bool) else None  # None: not begun
        if state is not None and state.output is not MISSING:
            reuse(step, step["id"], state, usage=False, items=count)
        else:
            run_again(step, step["id"], state, items=count)
        for index in range(count or 0):
            sid = item_id(step["id"], index)
            item = states.get(sid)
            if item is not None and item.output is not MISSING:
                reuse(step, sid, item, item_of=step["id"], index=index)
            else:
                run_again(step, sid, item, item_of=step["id"], index=index)

    for step in steps:
        state = states.get(step["id"])
        if "for_each" in step and not (state is not None and state.skipped):
            fan_out(step, state)
        elif state is not None and state.output is not MISSING:
            reuse(step, step["id"], state)
        else:
            run_again(step, step["id"], state)
    effects = redrive_effects(run)
    lease = lease_of(run)
    live = lease is not None and leases.lease_live(lease["expires_at"], now=db_now())
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


def redrive_effects(run: Run) -> list[dict]:
    """The run's open side effects (claimed or unconfirmed), oldest first, each with what a re-drive does to it."""
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
    return effects


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


class DatabaseAway(Exception):
    """The web process knows the database is away (pal.db_away): /health says so without waiting on the pool."""


def _database_check() -> datetime | None:
    """A round trip on a connection known to be alive; returns when the last sweep finished."""
    why = db_away.database_away()
    if why:
        raise DatabaseAway(why)
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
    with app.connection_for_write(settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        if conn.transport.driver_type == "redis":
            conn.default_channel.client.ping()


# --- the operator's pages -------------------------------------------------------------------------


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
    bulk = BulkAction.objects.filter(id=bulk_id).first()
    if bulk is None:
        raise NotFound(f"bulk action {bulk_id} does not exist", code="bulk_not_found")
    return bulk

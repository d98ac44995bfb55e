"""What changes state. Views, the API, admin actions, tasks and commands all call these."""

import contextlib
import functools
import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.db.models import DateTimeField, JSONField, Q, UUIDField
from django.utils import timezone

from journal.receipts import usage_of
from journal.selectors import ReplayRow, events_of_kind, last_event, replay_rows_for_run, replay_rows_for_step
from journal.services import (
    NewEvent,
    NewJournal,
    ReservedKind,
    custom_event_append,
    dumps,
    events_append,
    journals_start,
    journals_start_part,
    read_tail,
)
from pal import rows, telemetry
from pal.clock import db_clock, db_now

from . import leases, search, selectors
from .audit import Audit
from .concurrency import child_concurrency_key, concurrency_key_for, slot_hand_over, slot_take, slot_take_child
from .dispatch import (
    book_drive,
    booked_task_id,
    drives_booked,
    drives_send_after_commit,
    enqueue_bulk,
    enqueue_drive,
    enqueue_wake,
)
from .errors import Conflict, NotFound, ServiceError, StepError, outcome_unknown
from .graph import ancestors_of
from .input_terms import input_terms_add, input_terms_part
from .models import (
    FINAL_STATUSES,
    LIVE_STATUSES,
    BulkAction,
    BulkStatus,
    Run,
    RunStatus,
    SideEffect,
    SideEffectStatus,
    Signal,
    Workflow,
)
from .replay import MISSING, replay
from .steps.base import NAME_RE, StepContext, get_kind
from .workflows import step_invoke, validate_definition

__all__ = ["Conflict", "NotFound", "ServiceError"]  # the refusals, importable from here as before (runs.errors)


# --- workflows ------------------------------------------------------------------------------------


def workflow_create(*, definition: dict) -> Workflow:
    """Validate and store a definition; an existing name gets version + 1. Raises WorkflowInvalid."""
    validate_definition(definition)
    name = definition["name"]
    for _ in range(5):
        latest = Workflow.objects.filter(name=name).order_by("-version").values_list("version", flat=True).first()
        try:
            with transaction.atomic():
                return Workflow.objects.create(
                    name=name,
                    version=(latest or 0) + 1,
                    description=definition.get("description", ""),
                    definition=definition,
                )
        except IntegrityError:
            continue  # two posts of the same name raced for the version number
    raise Conflict(f"could not allocate a version for workflow {name!r}; try again", code="version_race")


# Every POST /runs reads its workflow: SQL built once (pal.rows), as Workflow.objects.filter(...).first() would.
_WORKFLOW_LATEST = rows.Read(Workflow, "w", tail="FROM workflows w WHERE w.name = %s ORDER BY w.version DESC LIMIT 1")
_WORKFLOW_VERSION = rows.Read(Workflow, "w", tail="FROM workflows w WHERE w.name = %s AND w.version = %s LIMIT 1")


def workflow_get(*, name: str, version: int | None = None) -> Workflow:
    if version:
        workflow = _WORKFLOW_VERSION.one([name, int(version)])
    else:
        workflow = _WORKFLOW_LATEST.one([name])
    if workflow is None:
        what = f"workflow {name!r}" + (f" version {version}" if version else "")
        raise NotFound(f"{what} does not exist", code="workflow_not_found")
    return workflow


class _Known:
    """The workflow versions this process has read for run_create, by (name, version asked: None for the latest).

    A POST /runs read its workflow before its run's statement, a round trip of its own. A version never changes
    (the admin can delete one no run uses, not edit it), but the latest of a name does whenever a new version is
    posted, by any process. So a known workflow is used only under a check that the run's statement itself makes
    (_runs_insert's `fresh`): the row is still there and, for the latest, no newer version of the name exists.
    When the check fails, nothing is written and run_create reads the workflow again: what a read first would
    have found, with the same snapshot rules (a version committed after the statement began is not seen either
    way). Postgres only (the check is a part of the one statement); a few hundred names at most."""

    LIMIT = 512

    def __init__(self):
        self.workflows: dict[tuple[str, int | None], Workflow] = {}

    def get(self, name: str, version: int | None) -> Workflow | None:
        return self.workflows.get((name, version))

    def keep(self, name: str, version: int | None, workflow: Workflow) -> None:
        if len(self.workflows) >= self.LIMIT:
            self.workflows.clear()
        self.workflows[(name, version)] = workflow

    def forget(self, name: str, version: int | None) -> None:
        self.workflows.pop((name, version), None)


_known = _Known()


def _fresh_check(workflow: Workflow, *, latest: bool) -> tuple[str, list]:
    """The condition every part of a run's statement is written under when it uses a known workflow (_Known)."""
    sql = "EXISTS (SELECT 1 FROM workflows WHERE id = %s AND name = %s AND version = %s)"
    params: list = [workflow.pk, workflow.name, workflow.version]
    if latest:
        sql += " AND NOT EXISTS (SELECT 1 FROM workflows WHERE name = %s AND version > %s)"
        params += [workflow.name, workflow.version]
    return sql, params


class _Stale(Exception):
    """A known workflow's check failed: the run's statement wrote nothing."""


# --- runs -----------------------------------------------------------------------------------------


def _request_hash(workflow: str, version: int | None, input: Any) -> str:
    return hashlib.sha256(dumps({"workflow": workflow, "version": version, "input": input}).encode()).hexdigest()


def run_create(
    *,
    workflow_name: str,
    input: dict | None = None,
    version: int | None = None,
    idempotency_key: str | None = None,
    created_by: str = "",
) -> tuple[Run, bool]:
    """Create a run and send its first task after commit. Returns (run, created).

    With an idempotency key, the same key and body return the existing run (created=False) and the same key
    with another body raises Conflict. The unique constraint decides a race, not a read-then-write.
    """
    input = {} if input is None else input
    if not isinstance(input, dict):
        raise ServiceError("input must be a JSON object", code="invalid_input")
    request_hash = _request_hash(workflow_name, version, input)
    if idempotency_key:
        existing = _run_for_key(idempotency_key, request_hash)
        if existing:
            return existing, False

    def insert(workflow: Workflow, fresh: tuple[str, list] | None = None) -> Run:
        return _run_insert(
            workflow=workflow,
            input=input,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            created_by=created_by,
            fresh=fresh,
        )

    known = _known.get(workflow_name, version) if connection.vendor == "postgresql" else None
    workflow = known or workflow_get(name=workflow_name, version=version)
    try:
        with _alone():
            try:
                run = insert(workflow, _fresh_check(workflow, latest=not version) if known else None)
            except _Stale:
                _known.forget(workflow_name, version)
                workflow = workflow_get(name=workflow_name, version=version)  # read again: a new version, or none
                run = insert(workflow)
        if connection.vendor == "postgresql":
            _known.keep(workflow_name, version, workflow)
    except IntegrityError:
        existing = _run_for_key(idempotency_key, request_hash) if idempotency_key else None
        if existing:
            return existing, False
        raise
    return run, True


# A POST /runs with an Idempotency-Key reads its key first: SQL built once (pal.rows), the run with its workflow as
# select_related("workflow") gives it (the key is unique), and its lease, which the answer to a repeat shows.
_RUN_FOR_KEY = rows.Read(
    Run,
    "r",
    joined={"workflow": "w", "lock": "l"},
    tail="FROM runs r JOIN workflows w ON w.id = r.workflow_id LEFT JOIN run_locks l ON l.run_id = r.id "
    "WHERE r.idempotency_key = %s",
)


def _run_for_key(key: str, request_hash: str) -> Run | None:
    run = _RUN_FOR_KEY.one([key])
    if run is not None and run.request_hash != request_hash:
        raise Conflict("this Idempotency-Key was used with another request body", code="idempotency_conflict")
    return run


@dataclass
class _NewRun:
    """A run to create (_runs_insert): _run_insert's keywords."""

    workflow: Workflow
    input: dict
    created_by: str
    idempotency_key: str | None = None
    request_hash: str = ""
    parent: Run | None = None
    parent_step_id: str | None = None
    parent_attempt: int | None = None
    writer: str | None = None
    forked_from: dict | None = None
    reused: list[NewEvent] | None = None


def _run_insert(
    *,
    workflow: Workflow,
    input: dict,
    created_by: str,
    idempotency_key: str | None = None,
    request_hash: str = "",
    parent: Run | None = None,
    parent_step_id: str | None = None,
    parent_attempt: int | None = None,
    writer: str | None = None,
    forked_from: dict | None = None,
    reused: list[NewEvent] | None = None,
    fresh: tuple[str, list] | None = None,
) -> Run:
    """The one way a run comes to be: insert it and journal run_created, in the caller's transaction.

    A fork (forked_from: {run_id, from_step, by, why}) links to its original, says so in its run_created, and
    journals right after it the steps it reuses (`reused`: step_completed / step_skipped with reused_from).

    A run of its own is queued, and its lease is booked for its first task (sent on commit). A child (parent
    given) is created running, driven by its parent's walk (neither the queue nor the sweep can claim it while
    that walk drives it); its depth comes from the parent's row, and its run_created says whose step made it. A child
    over its group's limit is created queued on it instead, with no lease and no task (runs.concurrency)."""
    new = _NewRun(
        workflow=workflow,
        input=input,
        created_by=created_by,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        parent=parent,
        parent_step_id=parent_step_id,
        parent_attempt=parent_attempt,
        writer=writer,
        forked_from=forked_from,
        reused=reused,
    )
    return _runs_insert([new], fresh=fresh)[0]


def _runs_insert(news: list[_NewRun], *, fresh: tuple[str, list] | None = None) -> list[Run]:
    """_run_insert of several runs, in the caller's transaction and in order: their rows, the lease bookings of
    those of their own (a child has none), their inputs' terms and their journals' first rows (each run's chained
    from GENESIS and fenced by its booking: the rows events_append would write one run at a time), whatever their
    number. POST /runs makes one run through here, POST /runs/batch many.

    On Postgres that is ONE statement, each INSERT a part of it (_statement_of): a run's row, its booking and its
    journal go in together or not at all even without a transaction, so POST /runs needs none of its own (BEGIN
    and COMMIT were two of its round trips, each as dear to the web process as a statement: docs/PERFORMANCE.md,
    E). Elsewhere, four statements in the caller's transaction. fresh (Postgres): a condition (sql, params) every
    part is written under (run_create's check of a known workflow); when it is false nothing is written and _Stale
    is raised."""
    now = timezone.now()
    runs, events_of = [], []
    for new in news:
        run, events = _run_row(new, now=now)
        runs.append(run)
        events_of.append(events)
    own = [run.id for run, new in zip(runs, news, strict=True) if new.parent is None]
    bookings = drives_booked(run_ids=own)
    postgres = connection.vendor == "postgresql"
    booking_part: tuple[str, list] | None = None
    if postgres:
        booked: list = []
        if bookings:
            sql, params, booked = leases.lease_reserve_new_part(bookings=bookings)
            booking_part = (sql, params)
    else:
        _runs_save(runs)
        booked = leases.lease_reserve_new(bookings=bookings)
        input_terms_add((run.id, run.created_at, run.input) for run in runs)
    fences = dict(zip(own, booked, strict=True))
    journals = []
    for run, new, events in zip(runs, news, events_of, strict=True):
        fence = fences.get(run.id)
        # The lease it was created with, as its row is at the commit (selectors.lease_of's dict): while its owner
        # still holds it nobody has taken the run, and POST /runs answers it without a read (runs.api.run_out).
        run.booked_lease = (
            {"owner": fence.owner, "epoch": fence.epoch, "expires_at": fence.expires_at} if fence is not None else None
        )
        journals.append(NewJournal(run.id, events, writer=new.writer or new.created_by or "api", fence=fence))
    if postgres:
        insert = _runs_insert_sql()
        rows_part = (insert.sql, [insert.records(runs)])  # first: it stamps created_at, which the terms repeat
        # The bookings' expiry is the database's clock + TTL, one value for the statement: the statement returns
        # it (from the booking part), so the answer shows the lease as it is, still without reading it back.
        written, expires_at = _statement_of(
            [
                rows_part,
                booking_part,
                input_terms_part((run.id, run.created_at, run.input) for run in runs),
                journals_start_part(journals=journals, now=timezone.now()),
            ],
            when=fresh,
            returning=(1, "expires_at") if booking_part is not None else None,
        )
        if fresh is not None and not written:
            raise _Stale
        if expires_at is not None:
            clock = expires_at - timedelta(seconds=settings.PAL_LEASE_TTL)  # the database's, when it booked them
            for run in runs:
                if run.booked_lease is not None:
                    run.booked_lease["expires_at"] = expires_at
                    run.db_now = clock  # type: ignore[attr-defined]  # what judges the booking (runs.api.run_out)
        for run in runs:
            run._state.adding, run._state.db = False, DEFAULT_DB_ALIAS  # saved, as bulk_create marks them
    else:
        journals_start(journals=journals)
    drives_send_after_commit(bookings)  # registered once the rows are written: in autocommit it sends at once
    return runs


def _statement_of(
    parts: list[tuple[str, list] | None],
    *,
    when: tuple[str, list] | None = None,
    returning: tuple[int, str] | None = None,
) -> tuple[int, Any]:
    """Run INSERTs (sql, params) as one statement, each but the last a data-modifying WITH of the last (None: no
    such part). Postgres runs every part with the same snapshot and checks the
    foreign keys (deferred, as Django makes them) at the statement's end in autocommit, else at the commit, once
    all the rows are in. when: a condition (sql, params) each part's rows are written under (`WHERE` on each
    INSERT's SELECT: every part ends in its FROM), computed once (a CTE of its own, first). returning: (the index
    in parts of a part that is not the last, a column of its rows): returns (rowcount, that column of its first
    row), else (rowcount, None)."""
    given = [part for part in parts if part is not None]
    ctes, params = [], []
    guard = ""
    if when is not None:
        ctes.append(f"fresh AS (SELECT {when[0]} AS ok)")
        params += when[1]
        guard = " WHERE (SELECT ok FROM fresh)"
    returned = parts[returning[0]] if returning is not None else None
    column = returning[1] if returning is not None else ""
    back_of = "NULL"
    for n, (part, part_params) in enumerate(given[:-1]):
        back = f" RETURNING {column}" if returned is not None and given[n] is returned else ""
        ctes.append(f"part{n} AS ({part}{guard}{back})")
        params += part_params
        if back:
            back_of = f"(SELECT {column} FROM part{n} LIMIT 1)"
    last, last_params = given[-1]
    sql = ("WITH " + ", ".join(ctes) + " " if ctes else "") + last + guard
    if returning is not None:
        sql += f" RETURNING {back_of}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params + last_params)
        value = cursor.fetchone() if returning is not None and cursor.rowcount else None
        return cursor.rowcount, (value[0] if value else None)


def _alone():
    """The transaction a create of runs needs around _runs_insert: none on Postgres in autocommit (one statement,
    _statement_of); else an atomic block, which inside a caller's transaction is a savepoint, so that a key's
    IntegrityError undoes only the create."""
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        return contextlib.nullcontext()
    return transaction.atomic()


def _runs_save(runs: list[Run]) -> None:
    """Run.objects.bulk_create(runs) (SQLite; Postgres inserts the rows as a part of _runs_insert's statement)."""
    Run.objects.bulk_create(runs)


def _json_text(encoder):
    return lambda value: None if value is None else json.dumps(value, cls=encoder)


def _plain_text(value):
    return None if value is None else (value.isoformat() if isinstance(value, datetime) else str(value))


class _RunsInsert:
    """Run.objects.bulk_create(runs) as one prebuilt INSERT (Postgres): bulk_create prepared each of the 24 fields
    of every run through the field's machinery (a quarter of a batch's CPU); the rows are the same: each value as
    the field prepares it, auto_now(_add) stamps set as its pre_save sets them.

    Every run's row in one JSON text of records: jsonb_to_recordset gives each column its type, so the statement
    is the same for any number of runs. A JSONField's value goes as the text its encoder writes (what Django sends
    for it: json.dumps(value, cls=field.encoder)), cast to jsonb; a uuid as its text; a timestamp as its ISO text,
    to the microsecond; None as null (SQL NULL, as Django sends a None)."""

    def __init__(self):
        fields: list[Any] = list(Run._meta.concrete_fields)
        quote = connection.ops.quote_name
        self.stamps = [
            field for field in fields if isinstance(field, DateTimeField) and (field.auto_now or field.auto_now_add)
        ]
        self.columns: list[tuple[str, str, Any]] = []
        names, picked, types = [], [], []
        for field in fields:
            column = quote(field.column)
            if isinstance(field, JSONField):
                convert, picked_as, typed_as = _json_text(field.encoder), f"v.{column}::jsonb", "text"
            else:
                own = field.target_field if field.is_relation else field
                plain = isinstance(own, (UUIDField, DateTimeField))
                convert, picked_as, typed_as = _plain_text if plain else None, f"v.{column}", field.db_type(connection)
            self.columns.append((field.attname, field.column, convert))
            names.append(column)
            picked.append(picked_as)
            types.append(f"{column} {typed_as}")
        self.sql = (
            f"INSERT INTO {quote(Run._meta.db_table)} ({', '.join(names)}) "
            f"SELECT {', '.join(picked)} FROM jsonb_to_recordset(%s::jsonb) AS v({', '.join(types)})"
        )

    def records(self, runs: list[Run]) -> str:
        out = []
        for run in runs:
            for field in self.stamps:
                field.pre_save(run, add=True)  # created_at and updated_at, as bulk_create stamps them
            record = {}
            for attname, column, convert in self.columns:
                value = getattr(run, attname)
                record[column] = value if convert is None else convert(value)
            out.append(record)
        return json.dumps(out)


@functools.cache
def _runs_insert_sql() -> _RunsInsert:
    return _RunsInsert()


def _run_row(new: _NewRun, *, now) -> tuple[Run, list[NewEvent]]:
    """The row of a run to create (not saved) and its first journal events. A child takes its group's slot here."""
    parent, workflow, input = new.parent, new.workflow, new.input
    child = parent is not None
    key = child_concurrency_key(parent=parent, workflow=workflow, input=input) if parent else None
    held = slot_take_child(key=key, workflow=workflow) if parent else None
    running = child and held is None
    meta = (
        {"parent_run_id": str(parent.id), "parent_step_id": new.parent_step_id, "attempt": new.parent_attempt}
        if parent is not None
        else {}
    )
    run = Run(
        workflow=workflow,
        input=input,
        idempotency_key=new.idempotency_key,
        request_hash=new.request_hash,
        created_by=new.created_by,
        parent_run=parent,
        parent_step_id=new.parent_step_id,
        parent_attempt=new.parent_attempt,
        forked_from_id=new.forked_from["run_id"] if new.forked_from else None,
        depth=parent.depth + 1 if parent is not None else 0,
        trigger_meta={**meta, **telemetry.run_trace_meta()},  # the trace it was made in: its steps' trace
        concurrency_key=key if child else concurrency_key_for(workflow, input),
        status=RunStatus.RUNNING if running else RunStatus.QUEUED,
        started_at=now if running else None,
        waiting_on=held,
    )
    events = [
        NewEvent(
            "run_created",
            payload={
                "workflow": workflow.name,
                "version": workflow.version,
                "input": input,
                "by": new.created_by,
                "parent_run_id": str(parent.id) if parent is not None else None,
                "parent_step_id": new.parent_step_id,
                "parent_attempt": new.parent_attempt,
                "depth": run.depth,
                **({"forked_from": new.forked_from} if new.forked_from else {}),
            },
        ),
        *(new.reused or []),
    ]
    if running:
        events.append(NewEvent("run_started", payload={"worker": new.writer, "driven_by_parent": True}))
    return run, events


def run_create_child(*, parent: Run, step_id: str, attempt: int, workflow: Workflow, input: dict, by: str) -> Run:
    """The child run of a parent's step attempt, in the caller's (the parent walk's fenced) transaction."""
    return _run_insert(
        workflow=workflow,
        input=input,
        created_by=f"run {parent.id}",
        parent=parent,
        parent_step_id=step_id,
        parent_attempt=attempt,
        writer=by,
    )


def run_get(*, run_id) -> Run:
    try:
        return Run.objects.select_related("workflow").get(id=run_id)
    except (Run.DoesNotExist, ValueError):
        raise NotFound(f"run {run_id} does not exist", code="run_not_found") from None


def _run_locked(run_id) -> Run | None:
    """The run with its workflow, its row (only: of self) locked until the commit. The workflow's row stays free:
    wake-ups and re-drives of a workflow's other runs do not wait for each other."""
    return Run.objects.select_for_update(no_key=True, of=("self",)).select_related("workflow").filter(id=run_id).first()


def _parent_waits_on(run_id, parent_id) -> bool:
    return bool(parent_id) and (
        Run.objects.filter(id=parent_id, status=RunStatus.WAITING, waiting_on__child_run_id=str(run_id)).exists()
    )


def _book_after_commit(run_id) -> None:
    """Book a run's walk once the caller's transaction has committed, holding no other lock by then."""
    transaction.on_commit(lambda: book_drive(run_id=run_id), robust=True)  # lost: the sweep books it


def run_cancel(*, run_id, by: str, reason: str) -> Run:
    """Stop a run and every unfinished run below it, in one transaction: their leases are dropped (each holder is
    fenced out at its next write) and they end cancelled, children first, so no kill or lock timeout can leave a
    live child under a cancelled parent (all or nothing).

    A child that its parent waits on wakes the tree, so the parent's walk finds it cancelled. The locks come in the
    order every writer uses: the lease rows (the deepest runs first, then the run's, then its root's, booked for the
    walk that goes on, as run_wake books it), then the status rows from the bottom up, then the concurrency groups'
    rows (tests/runs/test_cancel_three_levels.py)."""
    Audit.of(by=by, reason=reason, action="a cancel")  # refused before anything is read
    try:
        run_uuid = uuid.UUID(str(run_id))
    except ValueError:
        raise NotFound(f"run {run_id} does not exist", code="run_not_found") from None
    now = timezone.now()
    parent_id = Run.objects.filter(id=run_uuid).values_list("parent_run_id", flat=True).first()
    root_id = _root_of(run_uuid) if _parent_waits_on(run_uuid, parent_id) else None
    task_id = str(uuid.uuid4())
    below = _unfinished_below(run_uuid)  # parent links never change: read before any lock
    with transaction.atomic():
        for child_id, _ in below:  # run_locks before runs, the order every writer uses; the deepest first
            leases.lease_drop(run_id=child_id)
        leases.lease_drop(run_id=run_id)  # from here its walk creates no child: its next write is fenced out
        late = [row for row in _unfinished_below(run_uuid) if row not in below]
        for child_id, _ in late:  # created between the read above and the drop
            leases.lease_drop(run_id=child_id)
        booking = leases.lease_reserve(run_id=root_id, task_id=task_id) if root_id not in (None, run_uuid) else None
        keys = {
            key
            for child_id, parent in [*late, *below]
            if (key := _cancelled(child_id, by=by, reason=f"parent {parent} cancelled: {reason}", now=now)) is not None
        }
        key = _cancelled(run_uuid, by=by, reason=reason, now=now)
        if key is None:
            run = run_get(run_id=run_id)
            raise Conflict(f"run {run_id} has already ended ({run.status})", code="run_ended")
        for group in sorted({*keys, key} - {""}):  # each group once, in one order for every cancel
            slot_hand_over(group)
        run = Run.objects.get(id=run_id)
        goes_on = None
        if _parent_waits_on(run_id, run.parent_run_id):
            # Its parent waits on it and nothing else would wake it: wake the tree, so the parent's walk finds
            # the child cancelled and fails its step (child_cancelled).
            goes_on = _wake_tree(run, by=by, why=f"child {run_id} cancelled: {reason}")
        if goes_on is not None and goes_on.id == root_id and booking is not None:
            enqueue_drive(run_id=root_id, task_id=task_id)
        else:
            if booking is not None:
                leases.lease_release(fence=booking)  # no walk goes on from the root: its booking is not needed
            if goes_on is not None:
                # The root was not booked above (a live lease held it, then it parked on this run; or an ancestor
                # ended since _root_of looked): book it after the commit, with no row of the tree locked. A wake-up
                # that books it meanwhile wins; then this finds its lease and that walk reaches this run.
                _book_after_commit(goes_on.id)
    return run_get(run_id=run_id)


def run_end_below_cancelled(*, run_id, by: str) -> bool:
    """A run whose ancestor was cancelled is never driven: the sweep and the walk end it cancelled instead (True).
    Only a tree cancelled before cancels were one transaction, or rows written by hand, can hold such a run."""
    ancestor = selectors.cancelled_ancestor(run_id)
    if ancestor is None:
        return False
    with contextlib.suppress(Conflict):  # it ended meanwhile
        run_cancel(run_id=run_id, by=by, reason=f"its ancestor {ancestor} was cancelled")
    return True


def _unfinished_below(run_id) -> list[tuple[Any, Any]]:
    """(id, parent id) of every unfinished run below run_id, the deepest first: one query per level."""
    levels, frontier = [], [run_id]
    while frontier:
        level = list(Run.objects.filter(parent_run_id__in=frontier).values_list("id", "parent_run_id"))
        levels.append(level)
        frontier = [child_id for child_id, _ in level]
    unfinished = set(
        Run.objects.filter(id__in=[i for level in levels for i, _ in level])
        .exclude(status__in=FINAL_STATUSES)
        .values_list("id", flat=True)
    )
    return [row for level in reversed(levels) for row in level if row[0] in unfinished]


def _cancelled(run_id, *, by: str, reason: str, now) -> str | None:
    """Inside run_cancel's transaction, its lease dropped: end one run cancelled, journaled, its head recorded.
    Returns its concurrency group ("" without one, for the caller's hand-over), None when it had ended."""
    updated = (
        Run.objects.filter(id=run_id)
        .exclude(status__in=FINAL_STATUSES)
        .update(status=RunStatus.CANCELLED, finished_at=now, updated_at=now, waiting_on=None, wake_at=None)
    )
    if not updated:
        return None
    head = read_tail(run_id)  # moved to our run_cancelled row by the append: recorded in this commit
    events_append(
        run_id=run_id,
        tail=head,
        events=[NewEvent("run_cancelled", payload=Audit(by=by, why=reason).payload(reason=reason))],
        writer=by,
    )
    Run.objects.filter(id=run_id).update(journal_head_seq=head.seq, journal_head_hash=head.hash)
    return Run.objects.filter(id=run_id).values_list("concurrency_key", flat=True).first() or ""


def run_redrive(*, run_id, by: str, reason: str, force: bool = False) -> Run:
    """An operator's re-drive: refused while a live lease holds the run unless forced (a steal, new epoch).

    A queued or waiting run asks for a slot of its concurrency group, as a wake-up does (runs.concurrency), forced
    or not: force steals a lease, it never lets a group run more than max_runs. With a slot, a waiting run goes
    running in this commit and its task is sent; a queued run's task is sent and its walk starts it (no younger run
    of the group starts before it: slot_take). Without one, the run stays (or goes) queued on its group with the
    why, no task is sent, and its run_redriven says so ("queued"): a freed slot starts it in creation order."""
    audit = Audit.of(by=by, reason=reason, action="a re-drive")
    run = run_get(run_id=run_id)
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status}); use retry for a failed run", code="run_ended")
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        previous = leases.lease_describe(run_id=run_id)
        # run_locks, then the run's row, then its group's row: the order every writer uses.
        fence = leases.lease_reserve(run_id=run_id, task_id=task_id, force=force)
        if fence is None:
            held = previous or {}  # None: the lease came between the two reads
            raise Conflict(
                f"run {run_id} is held by a live lease ({held.get('owner')}, epoch {held.get('epoch')}, "
                f"until {held.get('expires_at')}); pass force to steal it",
                code="lease_held",
            )
        # The run's row, locked, and its status read under the lock: an ending that committed first is seen (the
        # booking rolls back with the Conflict); a cancel that comes later waits for this commit (its lease_drop
        # writes the lease row booked above).
        locked = _run_locked(run_id)
        if locked is None or locked.status not in (*LIVE_STATUSES, RunStatus.WAITING):
            raise Conflict(f"run {run_id} has ended ({locked.status if locked else 'deleted'})", code="run_ended")
        run = locked
        queued = slot_take(run) if run.status in (RunStatus.QUEUED, RunStatus.WAITING) else None
        fields: dict[str, Any] = {}
        if queued is not None:
            fields = {"status": RunStatus.QUEUED, "waiting_on": queued, "wake_at": None}
        elif run.status == RunStatus.WAITING:
            fields = {"status": RunStatus.RUNNING}  # its slot is taken in this commit
        Run.objects.filter(id=run_id).update(updated_at=timezone.now(), **fields)
        payload = audit.payload(force=force, previous_lease=previous)
        payload["task_id"] = None if queued else booked_task_id(fence)
        if queued is not None:
            payload["queued"] = queued
        events_append(run_id=run_id, events=[NewEvent("run_redriven", payload=payload)], writer=by, fence=fence)
        if queued is not None:
            leases.lease_release(fence=fence)  # no task: a hand-over books the run when a slot frees
        else:
            enqueue_drive(run_id=run_id, task_id=task_id)
    return run_get(run_id=run_id)


# --- waiting: wake-ups, approvals, signals ---------------------------------------------------------


def _wake_tree(run: Run, *, by: str, why: str) -> Run | None:
    """Inside a transaction, after `run` was flipped from waiting to running: flip every waiting ancestor too (each
    was parked on its child), each taking a slot of its group as it goes, as a woken run does (runs.concurrency).
    Returns the run whose walk goes on, the root (the caller sends its task): children are driven by their parent's
    walk, so the root's walk adopts the woken child and goes on. None when an ancestor's group is full: that one is
    queued on its group (a hand-over books it) and the ones above it go on waiting on it."""
    root = run
    while root.parent_run_id:
        # Its row before its group's (slot_take), the order of every writer: a cancel of this one is ordered
        # before or after this look, and never waits for the group's row while we wait for the run's.
        parent = _run_locked(root.parent_run_id)
        assert parent is not None  # a parent link is a foreign key: the row is there
        held = slot_take(parent) if parent.status == RunStatus.WAITING else None
        flipped = Run.objects.filter(id=parent.id, status=RunStatus.WAITING).update(
            status=RunStatus.QUEUED if held else RunStatus.RUNNING,
            waiting_on=held,
            wake_at=None,
            updated_at=timezone.now(),
        )
        if flipped:
            waited = parent.waiting_on or {}
            events_append(
                run_id=parent.id,
                events=[
                    NewEvent(
                        "run_resumed",
                        waited.get("step_id"),
                        waited.get("attempt"),
                        {
                            "by": by,
                            "why": f"child {root.id} resumed: {why}",
                            "child_run_id": str(root.id),
                            "waited_on": waited,
                            **({"queued": held} if held else {}),
                        },
                    )
                ],
                writer=by,
            )
            if held:
                return None
        elif parent.status in FINAL_STATUSES:
            break  # an orphan: the sweep re-drives it on its own
        root = parent
    return root


def _root_of(run_id) -> Any:
    """The run a wake-up of run_id sends a task for: its topmost ancestor that has not ended (or run_id itself);
    None when there is no such run. Parent links never change, so this is read before any lock."""
    current = run_id
    while True:
        row = Run.objects.filter(id=current).values_list("parent_run_id", "parent_run__status").first()
        if row is None:
            return None if current == run_id else current
        if row[0] is None or row[1] in FINAL_STATUSES:
            return current
        current = row[0]


def _waits_on(waiting_on: Any, expect: dict) -> bool:
    """Whether a run's waiting_on matches expect: the wait itself, or one of several (a graph whose branches each
    wait on something lists them all under "waits")."""
    if not isinstance(waiting_on, dict):
        return not expect
    waits = [waiting_on, *(w for w in waiting_on.get("waits") or [] if isinstance(w, dict))]
    return any(all(wait.get(key) == value for key, value in expect.items()) for wait in waits)


def run_wake(*, run_id, by: str, why: str, expect: dict | None = None, extra_events: list | None = None) -> bool:
    """Wake a waiting run if it still waits on what `expect` says (kind, step_id, name ...). The row is locked
    while that is checked and the conditional update decides every race: of two wake-ups (or two decisions), one
    flips the row and the other gets False.

    The woken run asks for a slot of its concurrency group again, as a new run does (it gave its slot back when it
    parked): without one it goes queued on its group, journaled in its run_resumed ("queued"), and a hand-over
    starts it in creation order (runs.concurrency)."""
    try:
        root_id = _root_of(uuid.UUID(str(run_id)))
    except ValueError:
        root_id = None
    if root_id is None:
        raise NotFound(f"run {run_id} does not exist", code="run_not_found")
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        # run_locks before runs, the order every writer uses (a cancel drops the lease, then ends the run; parking
        # and endings release it, then set the status): the root's lease is booked first, then the run's row is
        # locked. Nothing of it stays if the run does not wake, and the booking is given back if no walk goes on.
        booking = leases.lease_reserve(run_id=root_id, task_id=task_id)
        run = _run_locked(run_id)
        if run is None:
            raise NotFound(f"run {run_id} does not exist", code="run_not_found")
        if run.status != RunStatus.WAITING or not _waits_on(run.waiting_on, expect or {}):
            transaction.set_rollback(True)
            return False
        waiting_on = run.waiting_on or {}
        held = slot_take(run)
        flipped = Run.objects.filter(id=run_id, status=RunStatus.WAITING).update(
            status=RunStatus.QUEUED if held else RunStatus.RUNNING,
            waiting_on=held,
            wake_at=None,
            updated_at=timezone.now(),
        )
        if flipped != 1:
            transaction.set_rollback(True)
            return False
        each = [w for w in waiting_on.get("waits") or [] if isinstance(w, dict)] or [waiting_on]
        woken = next((w for w in each if _waits_on(w, expect or {})), waiting_on)  # the wait this wake-up answers
        step_id, attempt = woken.get("step_id"), woken.get("attempt")
        events = [NewEvent(kind, step_id, attempt, payload) for kind, payload in (extra_events or [])]
        resumed = {"by": by, "why": why, "waited_on": waiting_on, **({"queued": held} if held else {})}
        events.append(NewEvent("run_resumed", step_id, attempt, resumed))
        events_append(run_id=run_id, events=events, writer=by)
        goes_on = None if held else _wake_tree(run, by=by, why=why)
        if goes_on is not None and goes_on.id == root_id:
            if booking is not None:  # None: a live lease holds the root; its walk will reach the woken run itself
                enqueue_drive(run_id=root_id, task_id=task_id)
        else:
            if booking is not None:
                leases.lease_release(fence=booking)  # no walk goes on from the root: its booking is not needed
            if goes_on is not None:  # an ancestor ended since _root_of looked: the orphan below it goes on
                book_drive(run_id=goes_on.id)
    return True


def approval_decide(
    *, run_id, step_id: str, approved: bool, by: str, comment: str = "", attempt: int | None = None
) -> Run:
    """Record a decision on a pending approval. Only one decision counts, even when two arrive at once.

    A decision is for one attempt of the step: `attempt` when the caller names it (the run page does, from what
    it showed), else the attempt waiting now. A late or doubled decision for attempt 1 therefore never decides
    attempt 2 (a retry's new wait): it answers 409 not_waiting_on_approval."""
    run = run_get(run_id=run_id)
    if run.status == RunStatus.RUNNING and _approval_decide_in_walk(
        run_id=run_id, step_id=step_id, approved=approved, by=by, comment=comment, attempt=attempt
    ):
        return run_get(run_id=run_id)
    run = run_get(run_id=run_id)  # it may have parked meanwhile: then the decision wakes it
    waiting_on = run.waiting_on or {}
    if attempt is None:
        attempt = next(
            (
                wait.get("attempt")
                for wait in [waiting_on, *(waiting_on.get("waits") or [])]
                if isinstance(wait, dict) and wait.get("step_id") == step_id
            ),
            None,
        )
    expect: dict[str, Any] = {"kind": "approval", "step_id": step_id}
    if attempt is not None:
        expect["attempt"] = attempt  # the conditional wake compares it too: a race with a retry cannot win
    decision = {"approved": bool(approved), "by": by, "comment": comment or "", "attempt": attempt}
    woke = run.status == RunStatus.WAITING and run_wake(
        run_id=run_id,
        by=by,
        why=f"approval {step_id} {'approved' if approved else 'rejected'}",
        expect=expect,
        extra_events=[("approval_decided", decision)],
    )
    if not woke:
        waits = _not_waiting_why(run, waiting_on)
        raise Conflict(
            f"run {run_id} does not wait on approval {step_id!r}"
            + (f" attempt {attempt}" if attempt is not None else "")
            + waits,
            code="not_waiting_on_approval",
        )
    return run_get(run_id=run_id)


def _not_waiting_why(run: Run, waiting_on: dict | None) -> str:
    """What the run does instead of waiting on the approval, for the 409 of a decision that came too soon or late."""
    if waiting_on and waiting_on.get("kind") == "concurrency":
        return (
            f" (it is queued on its concurrency group {waiting_on.get('key')!r}, {waiting_on.get('running')} of"
            f" {waiting_on.get('max_runs')} running: decide once a slot frees and the run waits on the approval again)"
        )
    if waiting_on:
        attempt = f" attempt {waiting_on['attempt']}" if waiting_on.get("attempt") is not None else ""
        return f" (it waits on {waiting_on.get('kind')} {waiting_on.get('step_id')}{attempt})"
    if run.status == RunStatus.RUNNING:
        return f" (it is {run.status}: its other branches are still moving; decide once the run waits)"
    return f" (it is {run.status})"


def _approval_decide_in_walk(*, run_id, step_id: str, approved: bool, by: str, comment: str, attempt) -> bool:
    """A decision on an approval of a graph's branch that parked while other branches still move (the run is
    running): journal it, if the journal shows that approval requested and undecided. The walk reads it when it would
    park the run (runs.executor.Walk.go_waiting writes the status first, then looks, so a decision committed before
    that look is seen; one after finds the run waiting and wakes it). The run's row is locked meanwhile."""
    with transaction.atomic():
        status = Run.objects.select_for_update(no_key=True).filter(id=run_id).values_list("status", flat=True).first()
        if status != RunStatus.RUNNING:
            return False
        # That step's rows alone fold into its state (runs.replay), and only they are read under the lock.
        state = replay(replay_rows_for_step(run_id=run_id, step_id=step_id)).get(step_id)
        if (
            state is None
            or state.output is not MISSING
            or state.failure is not None
            or "approval_requested" not in state.events
            or "approval_decided" in state.events
            or (attempt is not None and attempt != state.attempt)
        ):
            return False
        decision = {"approved": bool(approved), "by": by, "comment": comment or "", "attempt": state.attempt}
        events_append(run_id=run_id, events=[NewEvent("approval_decided", step_id, state.attempt, decision)], writer=by)
    return True


def signal_send(*, run_id, name: str, payload: Any = None, by: str = ""):
    """Keep a signal for the run (returns the Signal row); if it waits on that name now, wake it (its walk
    consumes the signal)."""
    if not NAME_RE.match(name or ""):
        raise ServiceError("a signal name is 1-64 characters of a-z 0-9 - _", code="invalid_signal_name", status=422)
    run = run_get(run_id=run_id)
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status}); a signal would never be consumed", code="run_ended")
    signal = Signal.objects.create(run=run, name=name, payload={} if payload is None else payload, sent_by=by)
    run_wake(run_id=run_id, by=by or "signal", why=f"signal {name!r} arrived", expect={"kind": "signal", "name": name})
    return signal


def run_wake_timer(*, run_id) -> bool:
    """Wake a run whose durable timer is due by the database's clock (sent with a countdown, and by the sweep as a
    backstop). A wake-up that came early (its eta was its sender's clock, ahead of this worker's, or the timer
    fired a moment early) is sent again for what is left; the beat's look wakes the run if that one is late."""
    wake_at = Run.objects.filter(id=run_id, status=RunStatus.WAITING).values_list("wake_at", flat=True).first()
    if wake_at is None:
        return False
    left = (wake_at - db_now()).total_seconds()
    if left > 0:
        enqueue_wake(run_id=run_id, countdown=left)
        return False
    # Any wait with a due wake time: a timer, or a rate limit's next slot (a graph may wait on others too: they
    # go on waiting once the run parks again).
    return run_wake(run_id=run_id, by="timer", why="timer due")


# --- bulk actions ---------------------------------------------------------------------------------

BULK_LIMIT = 10_000


def _bulk_candidates(*, action: str, filters: dict):
    """Runs matching the list's filters (runs.selectors.runs_matching) that the action can apply to (cancel and
    re-drive: unfinished; retry: failed)."""
    if action not in BulkAction.ACTIONS:
        raise ServiceError(f"action must be one of {', '.join(BulkAction.ACTIONS)}", code="invalid_action")
    status = filters.get("status")
    if status and status not in RunStatus.values:
        raise ServiceError(f"status must be one of {', '.join(RunStatus.values)}", code="invalid_filter")
    qs = selectors.runs_matching(
        status=status,
        workflow=filters.get("workflow"),
        parent=filters.get("parent"),
        ids=filters.get("ids"),
        q=filters.get("q"),
        stuck=bool(filters.get("stuck")),
        **search.search_filters(**{name: filters.get(name) for name in search.SEARCH_FILTERS}),
    )
    if action == "retry":
        qs = qs.filter(status=RunStatus.FAILED)
    else:
        qs = qs.exclude(status__in=FINAL_STATUSES)
    return qs.order_by("-created_at", "-id")


def bulk_preview(*, action: str, filters: dict) -> dict:
    ids = list(_bulk_candidates(action=action, filters=filters).values_list("id", flat=True)[: BULK_LIMIT + 1])
    return {
        "action": action,
        "count": min(len(ids), BULK_LIMIT),
        "truncated": len(ids) > BULK_LIMIT,
        "sample": [str(i) for i in ids[:20]],
    }


def bulk_start(*, action: str, filters: dict, reason: str, by: str, force: bool = False):
    """Fix the matching set now (what the operator previewed) and apply the action in a background task."""
    Audit.of(by=by, reason=reason, action="a bulk action")
    ids = [str(i) for i in _bulk_candidates(action=action, filters=filters).values_list("id", flat=True)[:BULK_LIMIT]]
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            action=action, filters=filters, run_ids=ids, reason=reason, force=force, created_by=by, total=len(ids)
        )
        enqueue_bulk(bulk_id=bulk.id)
    return bulk


class _ClaimTakenOver(Exception):
    """The sweep handed this bulk action to another delivery of its task: undo the run just applied and stop."""


def bulk_apply(*, bulk_id: int) -> None:
    """The task's body: apply the action to each run, journaled per run by its own service; progress as it goes.

    Each run's action commits together with the bulk's position and counts, fenced by this delivery's claim. So a
    delivery that takes over (the sweep sent the task again: the first was lost with the broker, or its worker
    died) goes on after the last run counted and applies or counts no run twice, and a delivery whose claim was
    taken over stops without committing the run it was on."""
    claim = uuid.uuid4().hex
    if not BulkAction.objects.filter(id=bulk_id, status=BulkStatus.PENDING).update(
        status=BulkStatus.RUNNING, claim=claim, updated_at=db_clock()
    ):
        return  # another delivery of this task holds it, or it is done
    bulk = BulkAction.objects.get(id=bulk_id)
    apply = {
        "cancel": lambda run_id: run_cancel(run_id=run_id, by=bulk.created_by, reason=bulk.reason),
        "redrive": lambda run_id: run_redrive(run_id=run_id, by=bulk.created_by, reason=bulk.reason, force=bulk.force),
        "retry": lambda run_id: run_retry(run_id=run_id, by=bulk.created_by, reason=bulk.reason),
    }[bulk.action]
    done, failed, errors = bulk.done, bulk.failed, list(bulk.errors)
    for position in range(bulk.position, len(bulk.run_ids)):
        run_id = bulk.run_ids[position]
        counted: dict[str, Any] = {"done": done, "failed": failed, "errors": errors}
        try:
            with transaction.atomic():
                try:
                    with transaction.atomic():  # a refusal undoes only what its own service wrote
                        apply(run_id)
                    counted["done"] += 1
                except ServiceError as exc:
                    counted["failed"] += 1
                    if len(errors) < 100:
                        counted["errors"] = [*errors, {"run_id": run_id, "detail": exc.detail, "code": exc.code}]
                if not BulkAction.objects.filter(id=bulk_id, claim=claim).update(
                    position=position + 1, updated_at=db_clock(), **counted
                ):
                    raise _ClaimTakenOver
        except _ClaimTakenOver:
            return
        done, failed, errors = counted["done"], counted["failed"], counted["errors"]
    BulkAction.objects.filter(id=bulk_id, claim=claim).update(
        status=BulkStatus.DONE, finished_at=timezone.now(), updated_at=db_clock()
    )


def run_retry(*, run_id, by: str, reason: str) -> Run:
    """A failed run goes on from its failed step with attempt + 1 (a new key); the steps before are reused.

    Journals run_retried (step_id = the failed step, attempt = the failed attempt + 1), which the executor's
    replay reads as that step's next attempt. Like any start it takes a slot of its concurrency group: with one the
    run goes running and its task is sent; without, it waits queued on the group (why, run_retried's "queued").
    """
    audit = Audit.of(by=by, reason=reason, action="a retry")
    run = run_get(run_id=run_id)
    if run.status != RunStatus.FAILED:
        raise Conflict(f"run {run_id} is {run.status}; only a failed run can be retried", code="run_not_failed")
    step_id, attempt = _failed_step(run)
    if step_id is None:
        raise Conflict(f"run {run_id} did not fail in a step, so there is no step to retry", code="no_failed_step")
    # An unknown outcome never makes a new attempt (docs/reference/keys.md): the retry sends it again under the same
    # attempt and key, so the peer can dedup it. A definite failure goes on with attempt + 1.
    next_attempt = attempt if outcome_unknown(run.error) else attempt + 1
    # In a graph, other steps or items may have failed too (their attempt's last word is a step_failed): each goes
    # on as well, so one retry runs every failed one again and reuses the rest.
    others = [
        (sid, state.attempt if outcome_unknown(state.failure) else state.attempt + 1, state.attempt)
        for sid, state in replay(replay_rows_for_run(run_id=run_id)).items()
        if sid != step_id and state.failure is not None and state.output is MISSING
    ]
    now = timezone.now()
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        # run_locks, then the run's row, then its group's row: the order every writer uses.
        fence = leases.lease_reserve(run_id=run_id, task_id=task_id)
        if fence is None:
            raise Conflict(f"run {run_id} is held by a live lease", code="lease_held")
        locked = _run_locked(run_id)
        if locked is None or locked.status != RunStatus.FAILED:  # another retry (or anything else) came first
            raise Conflict(f"run {run_id} is no longer failed", code="run_not_failed")
        # A retry is a start: it takes a slot of its concurrency group or waits queued on it (runs.concurrency).
        queued = slot_take(locked)
        Run.objects.filter(id=run_id, status=RunStatus.FAILED).update(
            status=RunStatus.QUEUED if queued else RunStatus.RUNNING,
            waiting_on=queued,
            error=None,
            output=None,
            finished_at=None,
            updated_at=now,
        )
        retried: dict[str, Any] = audit.payload()
        retried["task_id"] = None if queued else booked_task_id(fence)
        if queued is not None:
            retried["queued"] = queued
        events_append(
            run_id=run_id,
            events=[
                NewEvent("run_retried", sid, next_, payload={**retried, "failed_attempt": failed})
                for sid, next_, failed in [(step_id, next_attempt, attempt), *others]
            ],
            writer=by,
            fence=fence,
        )
        if queued is not None:
            leases.lease_release(fence=fence)  # no task: a hand-over books the run when a slot frees
        else:
            enqueue_drive(run_id=run_id, task_id=task_id)
    return run_get(run_id=run_id)


def _failed_step(run: Run) -> tuple[str | None, int]:
    """The step and attempt a failed run failed in: its error, else its last run_failed event."""
    error = run.error if isinstance(run.error, dict) else {}
    if error.get("step_id") and isinstance(error.get("attempt"), int):
        return error["step_id"], error["attempt"]
    last = last_event(run_id=run.id, kind="run_failed")
    if last is None or last.step_id is None:
        return None, 0
    return last.step_id, last.attempt or 1


def run_event_append(*, run_id, kind: str, step_id: str | None, payload: Any, by: str) -> int:
    """A custom event from the API (confidence_evaluated, anomaly_detected ...); reserved kinds are refused."""
    run_get(run_id=run_id)
    try:
        seq = custom_event_append(run_id=run_id, kind=kind, step_id=step_id, payload=payload, writer=by)
    except ReservedKind as exc:
        raise ServiceError(str(exc), code="reserved_kind", status=422) from None
    journal_head_advance(run_id=run_id)
    return seq


def journal_head_advance(*, run_id) -> None:
    """After an append to a run that has ended (a custom event), move its recorded journal head to the new last
    row, so verification does not take that row for a forged one. Conditional on the run having ended by now:
    an append that went in before the ending is covered by the head the ending records (it chains after it)."""
    head = read_tail(run_id)
    (
        Run.objects.filter(id=run_id, status__in=FINAL_STATUSES)
        .filter(Q(journal_head_seq__isnull=True) | Q(journal_head_seq__lt=head.seq))
        .update(journal_head_seq=head.seq, journal_head_hash=head.hash)
    )


# --- side effects: an operator's decision on a claimed-but-unconfirmed one ------------------------

SIDE_EFFECT_DECISIONS = ("mark_delivered", "send_again")


def side_effect_resolve(*, key: str, decision: str, by: str, reason: str):
    """Settle a side effect that was claimed and never confirmed (status claimed or unconfirmed), journaled on
    its run as side_effect_resolved with who and why. Returns the side effect as it is afterwards.

    mark_delivered: the operator checked that it arrived (or that it must not go out): it becomes delivered and
    nothing is sent.
    send_again:
    - a webhook whose step attempt is still open in a run that has not ended: the run is re-driven; its deliver
      step sends the webhook again with the same Idempotency-Key (the receiver dedups) and confirms it itself;
    - otherwise (an email, which a re-drive never sends again; or a webhook whose run went on or ended): it is
      sent now, from here, through the deliver step's own code with the same key (the same Message-ID for an
      email, the same Idempotency-Key for a webhook), and takes the status the peer's answer gives.
    A side effect still `claimed` by a run that a live lease holds is refused: its worker may be sending it now.
    Two decisions at once: a conditional update lets one through and the other gets a Conflict.
    """
    if decision not in SIDE_EFFECT_DECISIONS:
        raise ServiceError(f"decision must be one of {', '.join(SIDE_EFFECT_DECISIONS)}", code="invalid_decision")
    audit = Audit.of(by=by, reason=reason, action="a decision on a side effect")
    effect = SideEffect.objects.select_related("run", "run__workflow").filter(key=key).first()
    if effect is None:
        raise NotFound(f"side effect {key} does not exist", code="side_effect_not_found")
    open_statuses = (SideEffectStatus.CLAIMED, SideEffectStatus.UNCONFIRMED)
    if effect.status not in open_statuses:
        raise Conflict(
            f"side effect {key} is already {effect.status}; there is nothing to decide", code="side_effect_settled"
        )
    run = effect.run
    lease = selectors.lease_of(run) if effect.status == SideEffectStatus.CLAIMED else None
    if run.status not in FINAL_STATUSES and lease is not None and leases.lease_live(lease["expires_at"], now=db_now()):
        raise Conflict(
            f"run {run.id} is held by a live lease ({lease['owner']}, epoch {lease['epoch']}): its worker may "
            f"be sending {key} right now; decide once the lease has expired or the run has moved on",
            code="lease_held",
        )
    previous = effect.status
    resolved = audit.payload(key=key, channel=effect.channel, decision=decision, previous_status=previous)
    if decision == "mark_delivered":
        now = timezone.now()
        with transaction.atomic():
            taken = SideEffect.objects.filter(id=effect.id, status=previous, updated_at=effect.updated_at).update(
                status=SideEffectStatus.DELIVERED,
                delivered_at=now,
                updated_at=now,
                response={"resolved_by": by, "why": reason, "previous": effect.response},
            )
            if taken != 1:
                raise Conflict(f"side effect {key} changed while you decided; look again", code="side_effect_changed")
            events_append(
                run_id=run.id,
                events=[
                    NewEvent(
                        "side_effect_resolved",
                        effect.step_id,
                        effect.attempt,
                        {**resolved, "status": SideEffectStatus.DELIVERED},
                    )
                ],
                writer=by,
            )
            journal_head_advance(run_id=run.id)  # the run may have ended: its recorded head moves to this row
        return SideEffect.objects.get(id=effect.id)
    if effect.channel == "webhook" and run.status not in FINAL_STATUSES and _attempt_is_open(effect):
        with transaction.atomic():
            events_append(
                run_id=run.id,
                events=[
                    NewEvent(
                        "side_effect_resolved",
                        effect.step_id,
                        effect.attempt,
                        {**resolved, "status": previous, "via": "redrive"},
                    )
                ],
                writer=by,
            )
            run_redrive(run_id=run.id, by=by, reason=f"send {key} again: {reason}")
        return SideEffect.objects.get(id=effect.id)
    return _side_effect_send_now(effect, resolved=resolved, by=by)


def _attempt_is_open(effect) -> bool:
    """True when the effect's step attempt is the step's current attempt in the journal and has no outcome, so a
    re-drive runs that very attempt again (same key)."""
    state = replay(replay_rows_for_run(run_id=effect.run_id)).get(effect.step_id)
    return state is not None and state.attempt == effect.attempt and state.output is MISSING and state.failure is None


def _no_event(kind: str, payload: Any = None) -> int:
    """A send from an operator's decision is journaled once, as side_effect_resolved: the step's events are not."""
    return 0


def _side_effect_send_now(effect, *, resolved: dict, by: str):
    """Send a side effect again from here through the deliver step's code, with its original key and fields
    (rendered from the run's input and the journaled outputs of the steps before it). No transaction is open
    while it sends."""
    run = effect.run
    step = next((s for s in run.workflow.definition.get("steps", []) if s.get("id") == effect.step_id), None)
    kind = get_kind("deliver")
    if step is None or step.get("kind") != "deliver" or kind is None:
        raise Conflict(
            f"step {effect.step_id!r} of {run.workflow} is not a deliver step; cannot send {effect.key} again",
            code="not_a_deliver_step",
        )
    # Take the decision first (a conditional write), so two operators clicking at once send it once.
    now = timezone.now()
    marker = {
        **(effect.response if isinstance(effect.response, dict) else {}),
        "sending_again": {"by": by, "at": now.isoformat()},
    }
    if (
        SideEffect.objects.filter(id=effect.id, status=effect.status, updated_at=effect.updated_at).update(
            response=marker, updated_at=now
        )
        != 1
    ):
        raise Conflict(f"side effect {effect.key} changed while you decided; look again", code="side_effect_changed")
    states = replay(replay_rows_for_run(run_id=run.id))
    outputs = {sid: {"output": state.output} for sid, state in states.items() if state.output is not MISSING}
    context = {"input": run.input, "steps": outputs}
    outcome: dict = {}

    def confirm(_effect, *, status: str, response=None):
        when = timezone.now()
        SideEffect.objects.filter(id=effect.id).update(
            status=status,
            response={"sent_again_by": by, "answer": response},
            updated_at=when,
            **({"delivered_at": when} if status == "delivered" else {}),
        )
        outcome.update(status=status, response=response)

    ctx = StepContext(
        run_id=str(run.id),
        step_id=effect.step_id,
        attempt=effect.attempt,
        key=effect.key,
        resumed=True,
        timeout=step.get("timeout_seconds"),
        emit=_no_event,
        lease_lost=lambda: False,
        claim=lambda **_: (effect, True),  # the claim is this row: send under its key
        confirm=confirm,
    )
    problem = None
    try:
        step_invoke(step, ctx, context=context)
    except StepError as exc:
        problem = exc
    status = outcome.get("status") or effect.status
    events_append(
        run_id=run.id,
        events=[
            NewEvent(
                "side_effect_resolved",
                effect.step_id,
                effect.attempt,
                {
                    **resolved,
                    "status": status,
                    "via": "sent_now",
                    "answer": outcome.get("response"),
                    **({"error": problem.message} if problem else {}),
                },
            )
        ],
        writer=by,
    )
    journal_head_advance(run_id=run.id)  # the run may have ended: its recorded head moves to this row
    if problem is not None:
        raise Conflict(f"sending {effect.key} again failed: {problem.message}", code="send_failed")
    return SideEffect.objects.get(id=effect.id)


# --- fork: a new run of the same version that reuses the original's steps before a point ---------

FORK_NOTE = (
    "Reused steps keep the outputs the original computed from its input: a reused step whose fields read input "
    "that you changed is not run again (reusing is your choice; fork from an earlier step to run it anew)."
)


def _fork_plan(run: Run, *, from_step: str, input: dict | None) -> dict:
    """What a fork from `from_step` reuses and what it runs, from the original's journal.

    Runs anew: from_step and every step after it in the graph (its descendants through needs), and any other
    step that has no outcome in the original. Reused: every other step, with the journal row that holds its
    outcome (a step_completed, or a step_skipped whose `when` was false)."""
    steps = run.workflow.definition.get("steps", [])
    by_id = {step["id"]: step for step in steps}
    if not isinstance(from_step, str) or from_step not in by_id:
        raise ServiceError(
            f"from_step: {run.workflow} has no step {from_step!r} (its steps: {', '.join(by_id)})",
            code="unknown_step",
            status=422,
        )
    if input is not None and not isinstance(input, dict):
        raise ServiceError("input: must be a JSON object", code="invalid_input", status=422)
    after = {sid for sid, ancestors in ancestors_of(steps).items() if from_step in ancestors}
    rows = replay_rows_for_run(run_id=run.id)
    states = replay(rows)
    outcome_rows: dict[str, ReplayRow] = {}  # step id -> the row holding its current attempt's outcome
    for event in rows:
        sid, state = event.step_id, states.get(event.step_id or "")
        if sid is not None and sid in by_id and state is not None:
            if (event.kind == "step_completed" and event.attempt == state.attempt) or event.kind == "step_skipped":
                outcome_rows[sid] = event
    new_input = run.input if input is None else input
    changed = sorted(key for key in {*run.input, *new_input} if run.input.get(key) != new_input.get(key))
    reused, rerun = [], []
    for step in steps:
        sid, state, row = step["id"], states.get(step["id"]), outcome_rows.get(step["id"])
        if sid == from_step or sid in after:
            rerun.append(
                {
                    "step_id": sid,
                    "kind": step.get("kind"),
                    "why": "from_step" if sid == from_step else f"after {from_step}",
                }
            )
        elif state is None or state.output is MISSING or row is None:
            rerun.append({"step_id": sid, "kind": step.get("kind"), "why": "no outcome in the original"})
        else:
            prompt, completion, cost = usage_of(state.output) if not state.skipped else (0, 0, 0.0)
            text = dumps({k: v for k, v in step.items() if k != "id"})
            reused.append(
                {
                    "step_id": sid,
                    "kind": step.get("kind"),
                    "skipped": state.skipped,
                    "attempt": None if state.skipped else state.attempt,
                    "seq": row.seq,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "cost_usd": cost,
                    "reads_changed_input": [key for key in changed if f"input.{key}" in text],
                }
            )
    return {
        "run_id": run.id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "from_step": from_step,
        "input": new_input,
        "input_changed": changed,
        "reused": reused,
        "rerun": rerun,
        "saved": {
            "prompt_tokens": sum(r["prompt_tokens"] for r in reused),
            "completion_tokens": sum(r["completion_tokens"] for r in reused),
            "cost_usd": round(sum(r["cost_usd"] for r in reused), 10),
        },
        "note": FORK_NOTE,
    }


def run_fork_preview(*, run_id, from_step: str, input: dict | None = None) -> dict:
    """What run_fork would reuse (step, the original's row, tokens and cost saved) and what it would run anew;
    with the top-level input fields that change and, per reused step, those of them its fields read."""
    return _fork_plan(run_get(run_id=run_id), from_step=from_step, input=input)


def run_fork(*, run_id, from_step: str, reason: str, by: str, input: dict | None = None) -> Run:
    """A new run of the original's workflow version, from `from_step` on (CONTRACT section 6, fork).

    The steps it reuses are journaled in the new run, right after its run_created, as the original's outcome
    rows with reused_from {run_id, seq}: its walk replays them as completed (runs.replay), so they call no
    provider and send nothing; the rest run under the new run's keys. The original gets run_forked (who, why,
    the new run's id) in the same commit; the new run's forked_from and run_created name the original."""
    audit = Audit.of(by=by, reason=reason, action="a fork")
    original = run_get(run_id=run_id)
    plan = _fork_plan(original, from_step=from_step, input=input)
    completed = {
        row.seq: row
        for row in replay_rows_for_run(run_id=original.id)
        if row.seq in {r["seq"] for r in plan["reused"] if not r["skipped"]}
    }
    skipped = {
        event.seq: event
        for event in events_of_kind(
            run_id=original.id, kind="step_skipped", step_ids=[r["step_id"] for r in plan["reused"] if r["skipped"]]
        )
    }
    reused = []
    for entry in plan["reused"]:
        source = {"run_id": str(original.id), "seq": entry["seq"]}
        if entry["skipped"]:
            payload = skipped[entry["seq"]].payload or {}
            reused.append(NewEvent("step_skipped", entry["step_id"], None, {**payload, "reused_from": source}))
        else:
            payload = {k: v for k, v in (completed[entry["seq"]].payload or {}).items() if k != "ms"}
            payload.update(kind=entry["kind"], reused_from=source)
            reused.append(NewEvent("step_completed", entry["step_id"], 1, payload))
    link = {"run_id": str(original.id), "from_step": from_step, "by": by, "why": reason}
    with transaction.atomic():
        fork = _run_insert(
            workflow=original.workflow,
            input=plan["input"],
            created_by=by,
            forked_from=link,
            reused=reused,
        )
        events_append(
            run_id=original.id,
            events=[
                NewEvent(
                    "run_forked",
                    payload={
                        **audit.payload(),
                        "fork_run_id": str(fork.id),
                        "from_step": from_step,
                        "reused": [r["step_id"] for r in plan["reused"]],
                        "rerun": [r["step_id"] for r in plan["rerun"]],
                        "input_changed": plan["input_changed"],
                    },
                )
            ],
            writer=by,
        )
        journal_head_advance(run_id=original.id)  # the original has usually ended: its recorded head moves
    return run_get(run_id=fork.id)


# --- batch: many runs in one transaction ----------------------------------------------------------

BATCH_LIMIT = 500


def run_create_batch(*, items: list[dict], created_by: str) -> list[tuple[Run, bool]]:
    """Create many runs, all or nothing, in one transaction; each one's task is sent after the commit (one send
    per run). items: [{workflow, input, idempotency_key?, version?}]. Returns [(run, created)] in order.

    A bad item refuses the whole batch with 422 naming its index (runs[3].workflow). An idempotency key works as
    for run_create, per item: a key already used with the same body gives that run back (created False), with
    another body 409 naming the index; a key twice in one batch is refused."""
    if not isinstance(items, list) or not items:
        raise ServiceError("runs: give at least one run", code="invalid_batch", status=422)
    if len(items) > BATCH_LIMIT:
        raise ServiceError(
            f"runs: at most {BATCH_LIMIT} runs per batch (got {len(items)})", code="batch_too_large", status=422
        )
    workflows: dict[tuple[str, int | None], Workflow] = {}
    planned = []
    keys: dict[str, int] = {}
    for index, item in enumerate(items):
        name, version = item.get("workflow"), item.get("version")
        input = {} if item.get("input") is None else item["input"]
        key = item.get("idempotency_key") or None
        if not isinstance(name, str) or not name:
            raise ServiceError(f"runs[{index}].workflow: give a workflow name", code="invalid_workflow", status=422)
        if not isinstance(input, dict):
            raise ServiceError(f"runs[{index}].input: must be a JSON object", code="invalid_input", status=422)
        if (name, version) not in workflows:
            try:
                workflows[(name, version)] = workflow_get(name=name, version=version)
            except NotFound as exc:
                raise ServiceError(f"runs[{index}].workflow: {exc.detail}", code=exc.code, status=422) from None
        if key is not None:
            if key in keys:
                raise ServiceError(
                    f"runs[{index}].idempotency_key: the same key as runs[{keys[key]}]",
                    code="duplicate_key",
                    status=422,
                )
            keys[key] = index
        planned.append((workflows[(name, version)], input, key, _request_hash(name, version, input)))
    for attempt in range(2):
        existing = (
            {
                run.idempotency_key: run
                for run in Run.objects.select_related("workflow").filter(idempotency_key__in=list(keys))
            }
            if keys
            else {}
        )
        for index, (_, _, key, request_hash) in enumerate(planned):
            if key in existing and existing[key].request_hash != request_hash:
                raise Conflict(
                    f"runs[{index}].idempotency_key: this key was used with another request body",
                    code="idempotency_conflict",
                )
        try:
            with _alone():
                made = iter(
                    _runs_insert(
                        [
                            _NewRun(
                                workflow=workflow,
                                input=input,
                                idempotency_key=key,
                                request_hash=request_hash,
                                created_by=created_by,
                            )
                            for workflow, input, key, request_hash in planned
                            if key not in existing
                        ]
                    )
                )
                return [(existing[key], False) if key in existing else (next(made), True) for _, _, key, _ in planned]
        except IntegrityError:
            if attempt or not keys:
                raise  # not a key race: a bug to see
            # Another request took one of the keys meanwhile: read them again; that run is given back.
    raise AssertionError("unreachable")


# --- budgets --------------------------------------------------------------------------------------


def run_budget_raise(
    *, run_id, by: str, reason: str, max_cost_usd: float | None = None, max_tokens: int | None = None
) -> Run:
    """Raise (or lower) a run's budget caps, journaled budget_raised with who and why; every run of its tree that
    waits on this budget is woken and goes on if the new caps allow (else it waits again)."""
    audit = Audit.of(by=by, reason=reason, action="a budget change")
    if max_cost_usd is None and max_tokens is None:
        raise ServiceError("give max_cost_usd, max_tokens or both", code="invalid_budget", status=422)
    for name, value in (("max_cost_usd", max_cost_usd), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ServiceError(f"{name} must be a number above 0", code="invalid_budget", status=422)
    run = run_get(run_id=run_id)
    if not isinstance((run.workflow.definition or {}).get("budget"), dict):
        raise Conflict(f"run {run_id}'s workflow {run.workflow.name} has no budget", code="no_budget")
    if run.status in FINAL_STATUSES:
        raise Conflict(f"run {run_id} has ended ({run.status})", code="run_ended")
    caps = {k: v for k, v in (("max_cost_usd", max_cost_usd), ("max_tokens", max_tokens)) if v is not None}
    events_append(
        run_id=run_id,
        events=[NewEvent("budget_raised", payload={**caps, **audit.payload()})],
        writer=by,
    )
    tree = selectors.run_tree_ids(run)
    for waiting in Run.objects.filter(
        id__in=tree, status=RunStatus.WAITING, waiting_on__kind="budget", waiting_on__run_id=str(run_id)
    ).values_list("id", flat=True):
        run_wake(run_id=waiting, by=by, why=f"budget raised: {reason}", expect={"kind": "budget"})
    return run_get(run_id=run_id)

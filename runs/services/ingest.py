"""Creating runs: one (POST /runs, a schedule, a child) or a batch, with their bookings and first rows."""

import contextlib
import functools
import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.utils import timezone

from journal.services import (
    NewEvent,
    NewJournal,
    dumps,
    journals_start,
    journals_start_part,
)
from pal import rows, telemetry

from .. import attributes, leases
from ..code import code_workflow
from ..concurrency import child_concurrency_key, concurrency_key_for, slot_take_child
from ..dispatch import (
    drives_booked,
    drives_send_after_commit,
)
from ..errors import Conflict, NotFound, ServiceError
from ..input_terms import input_terms_add, input_terms_part
from ..models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    Run,
    RunStatus,
    Workflow,
)
from .workflows import _fresh_check, _known, _Stale, workflow_get

# --- runs -----------------------------------------------------------------------------------------


def _request_hash(workflow: str, version: int | None, input: Any, priority: int = 0) -> str:
    """What a repeat of a request with the same Idempotency-Key must match (a priority of 0 is left out: the hash
    of a run made before priorities)."""
    body = {"workflow": workflow, "version": version, "input": input, **({"priority": priority} if priority else {})}
    return hashlib.sha256(dumps(body).encode()).hexdigest()


def _priority(value: Any, *, field: str = "priority") -> int:
    """A run's priority as given, or 422 naming the field: a whole number from -100 to 100 (Django's task range)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ServiceError(
            f"{field}: a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, not {value!r}",
            code="invalid_priority",
            status=422,
        )
    return value


def run_create(
    *,
    workflow_name: str,
    input: dict | None = None,
    version: int | None = None,
    idempotency_key: str | None = None,
    created_by: str = "",
    priority: int | None = None,
) -> tuple[Run, bool]:
    """Create a run and send its first task after commit. Returns (run, created).

    With an idempotency key, the same key and body return the existing run (created=False) and the same key
    with another body raises Conflict. The unique constraint decides a race, not a read-then-write.
    """
    input = {} if input is None else input
    if not isinstance(input, dict):
        raise ServiceError("input must be a JSON object", code="invalid_input")
    priority = _priority(priority)
    request_hash = _request_hash(workflow_name, version, input, priority)
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
            priority=priority,
            fresh=fresh,
        )

    known = _known.get(workflow_name, version) if connection.vendor == "postgresql" else None
    code = code_workflow(workflow_name)
    if known is not None and code is not None and known.definition.get("code_version") != code.version:
        known = None  # this process's code changed under the version it knew (a test's; a reload's)
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
    priority: int = 0


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
    priority: int = 0,
    fresh: tuple[str, list] | None = None,
) -> Run:
    """The one way a run comes to be: insert it and journal run_created, in the caller's transaction."""
    # A fork (forked_from: {run_id, from_step, by, why}) links to its original, says so in its run_created, and
    # journals right after it the steps it reuses (`reused`: step_completed / step_skipped with reused_from).
    #
    # A run of its own is queued, and its lease is booked for its first task (sent on commit). A child (parent
    # given) is created running, driven by its parent's walk (neither the queue nor the sweep can claim it while
    # that walk drives it); its depth comes from the parent's row, and its run_created says whose step made it. A child
    # over its group's limit is created queued on it instead, with no lease and no task (runs.concurrency).
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
        priority=priority,
    )
    return _runs_insert([new], fresh=fresh)[0]


def _runs_insert(news: list[_NewRun], *, fresh: tuple[str, list] | None = None) -> list[Run]:
    """_run_insert of several runs, in the caller's transaction and in order: their rows, the lease bookings of
    those of their own (a child has none), their inputs' terms and their journals' first rows (each run's chained
    from GENESIS and fenced by its booking: the rows events_append would write one run at a time), whatever their
    number. POST /runs makes one run through here, POST /runs/batch many."""
    # On Postgres that is ONE statement, each INSERT a part of it (_statement_of): a run's row, its booking and its
    # journal go in together or not at all even without a transaction, so POST /runs needs none of its own
    # (docs/PERFORMANCE-code.md). Elsewhere, four statements in the caller's transaction. fresh
    # (Postgres): a condition (sql, params) every part is written under (run_create's check of a known workflow); when
    # it is false nothing is written and _Stale is raised.
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
        attributes.attributes_add(_attributes_of(runs, news))
    fences = dict(zip(own, booked, strict=True))
    journals = []
    for run, new, events in zip(runs, news, events_of, strict=True):
        fence = fences.get(run.id)
        # The lease it was created with, as its row is at the commit (selectors.lease_of's dict): while its owner
        # still holds it nobody has taken the run, and POST /runs answers it without a read (runs.api.runs.run_out).
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
                attributes.attributes_part(_attributes_of(runs, news)),
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
                    run.db_now = clock  # type: ignore[attr-defined]  # what judges the booking (runs.api.runs.run_out)
        for run in runs:
            run._state.adding, run._state.db = False, DEFAULT_DB_ALIAS  # saved, as bulk_create marks them
    else:
        journals_start(journals=journals)
    priorities = {run.id: run.priority for run in runs}
    # Registered once the rows are written: in autocommit it sends at once.
    drives_send_after_commit([(run_id, task_id, priorities[run_id]) for run_id, task_id in bookings])
    return runs


def _attributes_of(runs: list[Run], news: list[_NewRun]):
    """(run id, created_at, {name: value}) of the attributes new runs have at once: those that read only the input,
    or a fork's reused steps."""
    for run, new in zip(runs, news, strict=True):
        if not attributes.declared(run.workflow.definition):
            continue
        reused = {
            event.step_id: (event.payload or {}).get("output") if event.kind == "step_completed" else None
            for event in new.reused or []
            if event.kind in ("step_completed", "step_skipped") and event.step_id and "[" not in event.step_id
        }
        yield run.id, run.created_at, attributes.values_at_creation(run.workflow.definition, run.input, reused)


def _statement_of(
    parts: list[tuple[str, list] | None],
    *,
    when: tuple[str, list] | None = None,
    returning: tuple[int, str] | None = None,
) -> tuple[int, Any]:
    """Run INSERTs (sql, params) as one statement, each but the last a data-modifying WITH of the last (None: no
    such part). when: a condition (sql, params) each part's rows are written under (`WHERE` on each INSERT's
    SELECT: every part ends in its FROM), computed once (a CTE of its own, first). returning: (the index in parts
    of a part that is not the last, a column of its rows): returns (rowcount, that column of its first row), else
    (rowcount, None)."""
    # Postgres runs every part with the same snapshot and checks the foreign keys (deferred, as Django makes them)
    # at the statement's end in autocommit, else at the commit, once all the rows are in.
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


@functools.cache
def _runs_insert_sql() -> rows.Insert:
    return rows.Insert(Run)


def _run_row(new: _NewRun, *, now) -> tuple[Run, list[NewEvent]]:
    """The row of a run to create (not saved) and its first journal events. A child takes its group's slot here."""
    parent, workflow, input = new.parent, new.workflow, new.input
    child = parent is not None
    key = child_concurrency_key(parent=parent, workflow=workflow, input=input) if parent else None
    held = slot_take_child(key=key, workflow=workflow, priority=parent.priority) if parent else None
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
        priority=parent.priority if parent is not None else new.priority,  # a child goes at its parent's pace
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


# --- batch: many runs in one transaction ----------------------------------------------------------

BATCH_LIMIT = 500


def run_create_batch(*, items: list[dict], created_by: str) -> list[tuple[Run, bool]]:
    """Create many runs, all or nothing, in one transaction; each one's task is sent after the commit (one send
    per run). items: [{workflow, input, idempotency_key?, version?, priority?}]. Returns [(run, created)] in order."""
    # A bad item refuses the whole batch with 422 naming its index (runs[3].workflow). An idempotency key works as
    # for run_create, per item: a key already used with the same body gives that run back (created False), with
    # another body 409 naming the index; a key twice in one batch is refused.
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
        priority = _priority(item.get("priority"), field=f"runs[{index}].priority")
        planned.append(
            (workflows[(name, version)], input, key, _request_hash(name, version, input, priority), priority)
        )
    for attempt in range(2):
        existing = (
            {
                run.idempotency_key: run
                for run in Run.objects.select_related("workflow").filter(idempotency_key__in=list(keys))
            }
            if keys
            else {}
        )
        for index, (_, _, key, request_hash, _) in enumerate(planned):
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
                                priority=priority,
                            )
                            for workflow, input, key, request_hash, priority in planned
                            if key not in existing
                        ]
                    )
                )
                return [
                    (existing[key], False) if key in existing else (next(made), True) for _, _, key, _, _ in planned
                ]
        except IntegrityError:
            if attempt or not keys:
                raise  # not a key race: a bug to see
            # Another request took one of the keys meanwhile: read them again; that run is given back.
    raise AssertionError("unreachable")


def _run_locked(run_id) -> Run | None:
    """The run with its workflow, its row (only: of self) locked until the commit. The workflow's row stays free:
    wake-ups and re-drives of a workflow's other runs do not wait for each other."""
    return Run.objects.select_for_update(no_key=True, of=("self",)).select_related("workflow").filter(id=run_id).first()

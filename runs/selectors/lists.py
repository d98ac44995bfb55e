"""What lists read: the workflows, the runs a list's filters name, a page of them by cursor, one run with its
lease."""

import base64
import binascii
import json
import re
import uuid
from collections.abc import Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from journal.models import JournalEvent
from pal import rows
from pal.clock import db_clock

from .. import attributes as run_attributes
from .. import input_terms, leases, search
from ..errors import NotFound, ServiceError
from ..models import (
    Run,
    RunLock,
    RunQuerySet,
    RunStatus,
    Workflow,
)
from .stuck import stuck_runs


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
    attributes: dict[str, str] | None = None,
    user_id: int | None = None,
    input_after: tuple[datetime, Any] | None = None,
) -> RunQuerySet:
    """The runs that the list filters name (GET /runs, the runs page, a saved view, a bulk action's set), unordered.
    input: runs whose input contains this object (jsonb @>); created_after (inclusive) and created_before
    (exclusive): a half-open window; error_code: runs.error->>'code'; attributes: {name: text} (runs.attributes);
    q: the search box (q_matching; user_id: whose Idempotency-Keys). Each is index-backed on Postgres (attributes
    and `input` by a join, in the list's order, that input_after, a list's cursor, bounds)."""
    qs = stuck_runs() if stuck else Run.objects.all()
    if q:
        qs = q_matching(qs, q, user_id=user_id)
    narrowed_by_attributes = bool(attributes)
    if attributes:
        qs = run_attributes.narrowed(qs, attributes, after=input_after)
    if input:
        # One join at most: beside the attributes' walk, the containment is checked on the runs it finds.
        narrowed = qs if narrowed_by_attributes else input_terms.narrowed(qs, input, after=input_after)
        qs = narrowed.filter(search.input_contains(input, indexed=narrowed is qs and not narrowed_by_attributes))
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


# --- the search box ---------------------------------------------------------------------------------

_ID_START = re.compile(r"^[0-9a-f-]{1,36}$")
_STEP_KEY = re.compile(r"^([0-9a-f-]{36}):")  # {run_id}:{step_id}:{attempt}, an item's {run_id}:{step_id}[i]:{attempt}


def _id_range(text: str) -> Q | None:
    """Runs whose id starts with these hex digits, as a range of ids (the primary key answers it, on both
    databases: a UUID's order is its digits')."""
    digits = text.replace("-", "")
    if not _ID_START.match(text) or not digits or len(digits) > 32:
        return None
    shift = 4 * (32 - len(digits))
    low, high = int(digits, 16) << shift, (int(digits, 16) + 1) << shift
    return Q(id__gte=uuid.UUID(int=low)) & (Q(id__lt=uuid.UUID(int=high)) if high < 2**128 else Q())


def _q_parts(q: str, *, user_id: int | None) -> tuple[Q, list[str], str]:
    """What the search box's text may be: (runs by their id, its start, a step's key or an Idempotency-Key; the
    attribute names some run has with that text; the text)."""
    text = q.strip()
    lowered = text.lower()
    keys = [text] + ([f"api:{user_id}:{text}"] if user_id is not None else [])
    direct = Q(idempotency_key__in=keys)
    by_id = _id_range(lowered)
    if by_id is not None:
        direct |= by_id
    key = _STEP_KEY.match(lowered)
    if key:
        with suppress(ValueError):
            direct |= Q(id=uuid.UUID(key.group(1)))
    return direct, run_attributes.names_with_text(text), text


def q_matching(qs: RunQuerySet, q: str, *, user_id: int | None = None) -> RunQuerySet:
    """The search box: the run whose id is q or starts with it, the run of a step's key (run_id:step:attempt), the
    run of an Idempotency-Key (as stored, or as user_id sent it to the API), and the runs with an attribute whose
    text is q. Each part by an index; the attributes' only for the names some run has with that text."""
    direct, names, text = _q_parts(q, user_id=user_id)
    where = direct | Q(id__in=run_attributes.with_text(text, names)) if names else direct
    return qs.filter(where)


def q_as_attribute(q: str, *, user_id: int | None = None) -> tuple[str, str] | None:
    """(name, text) when the search box's text is one attribute's value and nothing else's (no run's id, its start,
    a step's key or a key): a list then walks that attribute's index, as attr.NAME=q would."""
    direct, names, text = _q_parts(q, user_id=user_id)
    if len(names) != 1 or Run.objects.filter(direct).exists():
        return None
    return names[0], run_attributes.text_of(text)


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
    attributes: dict[str, str] | None = None,
    user_id: int | None = None,
) -> tuple[list[Run], str | None]:
    """Newest first, keyset-paginated on (created_at, id): a page stays right while new runs arrive (they
    come before the first page) and no page counts the table. Returns (runs, next cursor or None).
    q, input, created_after, created_before, error_code, attributes, user_id: as runs_matching (runs.search and
    runs.attributes read them from text)."""
    after = cursor_decode(cursor) if cursor else None
    as_attribute = q_as_attribute(q, user_id=user_id) if q else None
    if as_attribute is not None:
        name, text = as_attribute
        if (attributes or {}).get(name, text) != text:
            return [], None  # q and attr.NAME ask for two values of one attribute
        attributes, q = {**(attributes or {}), name: text}, None
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
        attributes=attributes,
        user_id=user_id,
        input_after=after,
    )
    if after:
        created, run_id = after
        # created_at <= as well: the OR alone is no index bound, and the newest-first walk would pass every run
        # newer than the cursor (50,000 of them 1,000 runs deep at a million) before the page's first.
        qs = qs.filter(Q(created_at__lte=created), Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id))
    limit = max(1, min(limit, MAX_PAGE))
    if attributes:
        order = run_attributes.ORDER
    elif input and input_terms.terms_of(input):
        order = input_terms.ORDER
    else:
        order = ("-created_at", "-id")
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
    # The answer names the workflow and its version: its definition (every step of it, decoded from JSON on each
    # read: a 10,000-step workflow's took longer than the rest of the call) stays behind, as in the run list.
    deferred={"w": ("definition", "description")},
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
    read = run_with_lease_read(run_id=run_id)
    return run_found(read[0].one(read[1]) if read is not None else None, run_id=run_id)


def run_with_lease_read(*, run_id) -> tuple[rows.Read, list] | None:
    """run_with_lease's read and its parameters, for a caller that makes it in one statement with another
    (tokens.auth.TokenAuthWith, rows.read_both); None when run_id is no run id."""
    try:
        return _RUN_WITH_LEASE, [Run._meta.pk.get_db_prep_value(run_id, connection)]
    except (ValueError, ValidationError):
        return None


def run_found(run: Run | None, *, run_id) -> Run:
    """The run run_with_lease_read found, or NotFound when it found none."""
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
        run.db_now = clock  # type: ignore[attr-defined]  # the lease's judge, read with it (runs.api.runs.run_out)
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

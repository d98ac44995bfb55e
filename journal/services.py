"""The one way to write the journal: event_append / events_append, fenced by the writer's lease."""

# Each row carries the hash of its content and of the previous row (a per-run hash chain, journal.chain): the
# writer chains its rows after the run's last row and the INSERT goes through only if that row is still the last,
# so seqs have no gap and the chain cannot fork; two writers that race for the same seq collide on the primary key
# and the loser chains again, so there is no repeat.
# A fenced append carries the writer's (owner, epoch): it inserts only while that lease row exists with that
# epoch, and takes FOR SHARE on it (Postgres) so a steal or a cancel waits for the append to commit or sees it
# fail. One statement appends several events in one commit (a step's step_completed and the next step's
# step_started), which is what keeps a step's overhead at one round trip.

import functools
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.utils import timezone

from .models import RESERVED_KINDS
from .text import storable_json

SEQ_RETRIES = 200
# Rows of one INSERT: 7 parameters each (Postgres allows 65,535 a statement; SQLite 32,766), and a statement's text
# is cached per row count (_sql), so a longer list goes in chunks of this many (_append_chunked).
APPEND_ROWS = 2000


@dataclass(frozen=True)
class Fence:
    """A writer's lease: its owner name and the epoch it was granted (the fencing token)."""

    run_id: UUID
    owner: str
    epoch: int
    # An item of a fan-out run by another worker (runs.walk.fleet): its lease is the branch_locks row of this journal
    # step id, and its rows carry no epoch (the run lease's epochs, which only grow along seq, stay the run's).
    branch: str | None = None
    # A booking made for a new run (runs.leases.lease_reserve_new): when its lease row expires, so POST /runs can
    # answer the lease it booked without reading it back. Not part of the fence's identity.
    expires_at: datetime | None = field(default=None, compare=False)


class FencedOut(Exception):
    """The writer's lease is gone or has a newer epoch: it must stop writing and sending."""

    def __init__(self, fence: Fence):
        super().__init__(f"lease on run {fence.run_id} epoch {fence.epoch} held by {fence.owner} is no longer current")
        self.fence = fence


@dataclass(frozen=True)
class NewEvent:
    kind: str
    step_id: str | None = None
    attempt: int | None = None
    payload: Any = None
    # dumps_json(payload), when the writer checked the payload already: the append does not write it out again.
    payload_json: str | None = field(default=None, compare=False, repr=False)


# json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":"), sort_keys=True, ensure_ascii=...), the encoder
# made once rather than at every call (two payloads a step): an encoder holds no state between calls.
_ENCODERS = {
    ascii_only: DjangoJSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=ascii_only)
    for ascii_only in (True, False)
}


def _dumps(value, *, ensure_ascii: bool = True) -> str:
    return _ENCODERS[ensure_ascii].encode(value)


def dumps(value) -> str:
    """A payload as it is stored and hashed: text Postgres cannot hold in its escaped form (journal.text); the
    payload field's decoder reads it back as it came, and chain_verify hashes dumps() of that again."""
    value = value if value is not None else {}
    return storable_json(_dumps(value), reencode=_dumps, raw=lambda: _dumps(value, ensure_ascii=False))


# What dumps() writes, for plain JSON only: no NaN or infinity (jsonb refuses them), nothing that only an encoder's
# default() can write (a set, bytes, an object). For such a value both give the same text.
_STRICT = {
    ascii_only: json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=ascii_only, allow_nan=False)
    for ascii_only in (True, False)
}


class NotJSON(ValueError):
    """A value to journal that is not plain JSON; the message names where in it."""


def dumps_json(value, *, what: str = "the value") -> str:
    """dumps(value) for a value that must be plain JSON (a step's output, a tool's event), else NotJSON naming the
    first part that is not, e.g. "the output of step a is not JSON: output.seen is a set"."""
    value = value if value is not None else {}
    strict = _STRICT[True].encode
    try:
        return storable_json(strict(value), reencode=strict, raw=lambda: _STRICT[False].encode(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotJSON(f"{what} is not JSON: {_not_json_at(value, '') or exc}") from None


def _not_json_at(value, path: str) -> str | None:
    """Where value stops being plain JSON ("output.seen is a set"), or None when no part is found."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or 'it'} is {value!r}, which JSON cannot hold"
    if isinstance(value, (list, tuple)):
        items: Any = enumerate(value)
    elif isinstance(value, dict):
        if any(not isinstance(key, str) for key in value):
            return f"{path or 'it'} has a key that is not a string"
        items = value.items()
    else:
        return f"{path or 'it'} is a {type(value).__name__}"
    for key, item in items:
        found = _not_json_at(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


GENESIS = "0" * 64  # the prev_hash of a run's first row


@dataclass
class Tail:
    """A run's last journal row as a writer knows it: the next append must follow exactly this row."""

    seq: int = 0
    hash: str = GENESIS


def _scalar(value) -> str:
    """dumps() of a str, an int or None, without json's per-call encoder (the chain hashes every row)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if type(value) is int:
        return int.__repr__(value)
    return dumps(value)


def _stamp(created_at: datetime) -> str:
    return _scalar(created_at.astimezone(UTC).isoformat(timespec="microseconds"))


def _row_hash(
    prev_hash: str,
    run_text: str,
    seq,
    kind,
    step_id,
    attempt,
    payload_json: str,
    stamp_text: str,
    writer_text: str,
    epoch,
) -> str:
    content = (
        f"[{run_text},{_scalar(seq)},{_scalar(kind)},{_scalar(step_id)},{_scalar(attempt)},{payload_json},"
        f"{stamp_text},{writer_text},{_scalar(epoch)}]"
    )
    return hashlib.sha256(f"{prev_hash}\n{content}".encode()).hexdigest()


def row_hash(
    *,
    prev_hash: str,
    run_id,
    seq: int,
    kind: str,
    step_id,
    attempt,
    payload,
    created_at: datetime,
    writer: str,
    epoch,
    payload_json: str | None = None,
) -> str:
    r"""The chain: each row's hash covers its content and the previous row's hash (journal.chain verifies it).

    hash = sha256(prev_hash + "\n" + dumps([run_id, seq, kind, step_id, attempt, payload, created_at (UTC ISO,
    microseconds), writer, epoch])), the list written out element by element so that the payload, the only
    large part, is serialised once: payload_json is dumps(payload) when the caller has it already.
    """
    run = run_id if isinstance(run_id, UUID) else UUID(str(run_id))
    return _row_hash(
        prev_hash,
        _scalar(str(run)),
        seq,
        kind,
        step_id,
        attempt,
        dumps(payload) if payload_json is None else payload_json,
        _stamp(created_at),
        _scalar(writer or ""),
        epoch,
    )


@functools.lru_cache(maxsize=64)
def _sql(count: int, fenced: bool, vendor: str, branch: bool = False) -> str:
    pg = vendor == "postgresql"
    text, integer, jsonb, stamp = ("::text", "::integer", "::jsonb", "::timestamptz") if pg else ("", "", "", "")
    rows = ", ".join(
        f"(%s{integer}, %s{text}, %s{text}, %s{integer}, %s{jsonb}, %s{text}, %s{text})" for _ in range(count)
    )
    # The insert goes through only if the run's last row is still the one the hashes were chained to (else
    # another writer appended first: reread and chain again) and, when fenced, while the lease holds.
    ctes = ["last AS (SELECT hash FROM journal_events WHERE run_id = %s ORDER BY seq DESC LIMIT 1)"]
    sources = ["v"]
    if fenced:
        # The table name is the whole coupling to runs.RunLock (the journal never imports runs).
        lock = " FOR SHARE" if pg else ""
        ctes.insert(0, f"fence AS ({_fence_sql(branch)}{lock})")
        sources.append("fence")
    ctes.append(f"v(seq, kind, step_id, attempt, payload, prev_hash, hash) AS (VALUES {rows})")
    return (
        f"WITH {', '.join(ctes)} "
        "INSERT INTO journal_events "
        "(run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, hash) "
        f"SELECT %s, v.seq, v.kind, v.step_id, v.attempt, v.payload, %s{stamp}, %s, %s, v.prev_hash, v.hash "
        f"FROM {', '.join(sources)} WHERE COALESCE((SELECT hash FROM last), %s) = %s "
        "RETURNING seq"
    )


def _fence_sql(branch: bool) -> str:
    """The lease row a fenced writer must hold: the run's, or an item's (branch_locks, by table name too)."""
    if branch:
        return "SELECT 1 AS ok FROM branch_locks WHERE run_id = %s AND owner = %s AND epoch = %s AND sid = %s"
    return "SELECT 1 AS ok FROM run_locks WHERE run_id = %s AND owner = %s AND epoch = %s"


def fence_params(fence: Fence, *, vendor: str | None = None) -> list:
    run = fence.run_id if isinstance(fence.run_id, UUID) else UUID(str(fence.run_id))
    params = [run if (vendor or connection.vendor) == "postgresql" else run.hex, fence.owner, fence.epoch]
    return [*params, fence.branch] if fence.branch is not None else params


def _db_uuid(value: UUID | str):
    value = value if isinstance(value, UUID) else UUID(str(value))
    return value if connection.vendor == "postgresql" else value.hex


def read_tail(run_id) -> Tail:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, hash FROM journal_events WHERE run_id = %s ORDER BY seq DESC LIMIT 1", [_db_uuid(run_id)]
        )
        row = cursor.fetchone()
    return Tail(row[0], row[1]) if row else Tail()


def _fence_holds(fence: Fence) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_fence_sql(fence.branch is not None), fence_params(fence))
        return cursor.fetchone() is not None


def _payload_json(event: NewEvent) -> str:
    return event.payload_json if event.payload_json is not None else dumps(event.payload)


def _chained(events, payloads, *, seq: int, prev: str, run_text: str, stamp_text: str, writer_text: str, epoch):
    """(seq, event, payload_json, prev_hash, hash) of each event's row, chained after the row (seq, prev): the one
    rule both writers (events_append, journals_start) hash their rows by."""
    for event, payload_json in zip(events, payloads, strict=True):
        seq += 1
        digest = _row_hash(
            prev, run_text, seq, event.kind, event.step_id, event.attempt, payload_json, stamp_text, writer_text, epoch
        )
        yield seq, event, payload_json, prev, digest
        prev = digest


def events_append(
    *,
    run_id: UUID | str,
    events: list[NewEvent],
    writer: str = "",
    fence: Fence | None = None,
    epoch: int | None = None,
    now: datetime | None = None,
    tail: Tail | None = None,
) -> list[int]:
    """Append events in order in one statement (past APPEND_ROWS: in chunks, in one transaction); return their seqs.
    Raises FencedOut when the fence fails.

    tail, when the writer knows the run's last row (the executor does, from its replay), saves reading it; it is
    updated in place to the new last row.
    """
    if not events:
        return []
    if len(events) > APPEND_ROWS:
        return _append_chunked(
            run_id=run_id, events=events, writer=writer, fence=fence, epoch=epoch, now=now or timezone.now(), tail=tail
        )
    # Every step's commit comes through here: what the rows share is worked out once, not per row or per try (the
    # connection too: each attribute read through django.db.connection looks the thread's connection up again).
    db = connections[DEFAULT_DB_ALIAS]
    vendor = db.vendor
    run_uuid = run_id if isinstance(run_id, UUID) else UUID(str(run_id))
    run = run_uuid if vendor == "postgresql" else run_uuid.hex
    created_at = now or timezone.now()
    row_epoch = (None if fence.branch is not None else fence.epoch) if fence else epoch
    sql = _sql(len(events), fence is not None, vendor, fence is not None and fence.branch is not None)
    payloads = [_payload_json(event) for event in events]  # serialised once: the column and the hash
    run_text, stamp_text, writer_text = _scalar(str(run_uuid)), _stamp(created_at), _scalar(writer or "")
    fenced_by = fence_params(fence, vendor=vendor) if fence is not None else []
    known = tail
    for tries in range(SEQ_RETRIES):
        start = known if (known is not None and tries == 0) else read_tail(run_id)
        values: list[Any] = []
        rows = _chained(
            events,
            payloads,
            seq=start.seq,
            prev=start.hash,
            epoch=row_epoch,
            run_text=run_text,
            stamp_text=stamp_text,
            writer_text=writer_text,
        )
        for seq, event, payload_json, prev, digest in rows:
            values += [seq, event.kind, event.step_id, event.attempt, payload_json, prev, digest]
        params = [*fenced_by, run, *values, run, created_at, writer, row_epoch, GENESIS, start.hash]
        try:
            if tries == 0 and not db.in_atomic_block:
                seqs = _run(sql, params, db)  # the fast path: one statement, one commit
            else:
                # A savepoint inside an outer block (a collision must not poison it), or a short transaction.
                with transaction.atomic():
                    if tries and connection.vendor == "postgresql":
                        # After a collision, queue behind the other contended writers of this run, so a hot
                        # run still makes progress while the uncontended path stays one statement.
                        with connection.cursor() as cursor:
                            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7))", [str(run_id)])
                    seqs = _run(sql, params)
        except IntegrityError:
            time.sleep(random.uniform(0, 0.002 * min(tries + 1, 10)))
            continue  # another writer took this seq first: chain again after its row
        if seqs:
            if tail is not None:
                tail.seq, tail.hash = seq, digest  # the last row's
            return sorted(seqs)
        if fence is not None and not _fence_holds(fence):
            raise FencedOut(fence)
        # The tail moved (another writer appended): chain again after the new last row.
    raise RuntimeError(f"could not append to the journal of run {run_id} after {SEQ_RETRIES} tries")


def _append_chunked(*, run_id, events: list[NewEvent], writer, fence, epoch, now: datetime, tail: Tail | None):
    """events_append of more rows than one statement may carry (9,400 step_started of a wide graph passed psycopg's
    65,535 parameters): APPEND_ROWS at a time, each chained after the last, in one transaction (one commit)."""
    with transaction.atomic():
        known = tail if tail is not None else read_tail(run_id)
        seqs: list[int] = []
        for at in range(0, len(events), APPEND_ROWS):
            chunk = events[at : at + APPEND_ROWS]
            seqs += events_append(
                run_id=run_id, events=chunk, writer=writer, fence=fence, epoch=epoch, now=now, tail=known
            )
        return seqs


@dataclass(frozen=True)
class NewJournal:
    """The first rows of a run created in the caller's transaction (journals_start)."""

    run_id: UUID
    events: list[NewEvent]
    writer: str = ""
    fence: Fence | None = None  # its run lease's booking (not an item's): the rows carry its epoch, fenced by it


_START_COLUMNS = "run_id, seq, kind, step_id, attempt, payload, writer, epoch, owner, prev_hash, hash"
_START_WIDTH = _START_COLUMNS.count(",") + 1
# Postgres: every row in one JSON text of records, jsonb_to_recordset giving each column its type, so the statement
# is the same whatever the number of rows (psycopg converts it once, and the server prepares it); the payloads go
# as text and are cast to jsonb, as events_append sends them. One string to adapt, not one array per column: psycopg
# adapted the 11 arrays through a new cursor's dumpers at every call, about 0.15 ms for one run's row (POST /runs).
_START_RECORDS = (
    "SELECT * FROM jsonb_to_recordset(%s::jsonb) AS r(run_id uuid, seq integer, kind text, step_id text, "
    "attempt integer, payload text, writer text, epoch bigint, owner text, prev_hash text, hash text)"
)
_START_NAMES = _START_COLUMNS.split(", ")


@functools.lru_cache(maxsize=64)
def _start_sql(count: int, vendor: str) -> str:
    """journals_start's statement: `count` rows (SQLite: a VALUES list; Postgres: records, any count)."""
    pg = vendor == "postgresql"
    rows = _START_RECORDS if pg else "VALUES " + ", ".join([f"({', '.join(['%s'] * _START_WIDTH)})"] * count)
    jsonb, stamp, lock = ("::jsonb", "::timestamptz", " FOR SHARE") if pg else ("", "", "")
    # events_append's two conditions, per run: its fence holds (the lease row with that owner and epoch, held FOR
    # SHARE until the commit) and its journal is still empty (the rows were chained from GENESIS, as Tail() is).
    return (
        f"WITH v({_START_COLUMNS}) AS ({rows}), "
        "fence AS (SELECT l.run_id, l.owner, l.epoch FROM run_locks l "
        f"WHERE l.run_id IN (SELECT v.run_id FROM v WHERE v.owner IS NOT NULL){lock}) "
        "INSERT INTO journal_events "
        "(run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, hash) "
        f"SELECT v.run_id, v.seq, v.kind, v.step_id, v.attempt, v.payload{jsonb}, %s{stamp}, v.writer, v.epoch, "
        "v.prev_hash, v.hash FROM v "
        "WHERE (v.owner IS NULL OR EXISTS (SELECT 1 FROM fence f "
        "WHERE f.run_id = v.run_id AND f.owner = v.owner AND f.epoch = v.epoch)) "
        "AND NOT EXISTS (SELECT 1 FROM journal_events j WHERE j.run_id = v.run_id) "
        "RETURNING run_id"
    )


def journals_start(*, journals: list[NewJournal], now: datetime | None = None) -> None:
    """Write the first rows of runs created in the caller's transaction, every run's in one statement."""
    # Each run's rows are chained from GENESIS and fenced by its booking, as events_append(tail=Tail(), fence=...)
    # writes them one run at a time: the same rows and hashes. No other writer can know a run its creator has not
    # committed, so nothing races these rows; a row that does not go in (a fence gone, a journal not empty) raises,
    # and the caller's transaction rolls back whole.
    if not journals:
        return
    vendor = connection.vendor
    created_at = now or timezone.now()
    values, rows = _start_values(journals, created_at, vendor)
    if vendor == "postgresql":  # a record per row (_START_RECORDS)
        written = _run(_start_sql(0, vendor), [_start_records(values), created_at])
    else:
        written = _run(_start_sql(rows, vendor), [*values, created_at])
    if len(written) != rows:
        went_in = {UUID(str(run_id)) for run_id in written}
        for journal in journals:
            fence = journal.fence
            if fence is not None and UUID(str(journal.run_id)) not in went_in and not _fence_holds(fence):
                raise FencedOut(fence)
        raise RuntimeError(f"the first journal rows of {len(journals)} new runs did not all go in: a journal not empty")


def _start_values(journals: list[NewJournal], created_at: datetime, vendor: str) -> tuple[list[Any], int]:
    """journals_start's rows, each _START_WIDTH values in _START_COLUMNS' order: (the values, how many rows)."""
    stamp_text = _stamp(created_at)
    values: list[Any] = []
    rows = 0
    for journal in journals:
        run_uuid = journal.run_id if isinstance(journal.run_id, UUID) else UUID(str(journal.run_id))
        run_text, writer_text = _scalar(str(run_uuid)), _scalar(journal.writer or "")
        epoch, owner = (journal.fence.epoch, journal.fence.owner) if journal.fence else (None, None)
        payloads = [_payload_json(event) for event in journal.events]
        chained = _chained(
            journal.events,
            payloads,
            seq=0,
            prev=GENESIS,
            epoch=epoch,
            run_text=run_text,
            stamp_text=stamp_text,
            writer_text=writer_text,
        )
        for seq, event, payload_json, prev, digest in chained:
            values += [
                str(run_uuid) if vendor == "postgresql" else run_uuid.hex,
                seq,
                event.kind,
                event.step_id,
                event.attempt,
                payload_json,
                journal.writer or "",
                epoch,
                owner,
                prev,
                digest,
            ]
            rows += 1
    return values, rows


def _start_records(values: list[Any]) -> str:
    """The rows of _start_values as _START_RECORDS' one JSON text of records."""
    width = _START_WIDTH
    records = [dict(zip(_START_NAMES, values[at : at + width], strict=True)) for at in range(0, len(values), width)]
    return json.dumps(records)


# journals_start_part's INSERT: the rows of _START_RECORDS as they are, with no check of fence or tail.
_START_PART = (
    "INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, "
    "hash) SELECT v.run_id, v.seq, v.kind, v.step_id, v.attempt, v.payload::jsonb, %s::timestamptz, v.writer, "
    "v.epoch, v.prev_hash, v.hash FROM (" + _START_RECORDS + ") AS v"
)


def journals_start_part(*, journals: list[NewJournal], now: datetime) -> tuple[str, list]:
    """journals_start's rows as an INSERT (sql, params) for Postgres, to run as a part of the one statement that
    also inserts the runs and their lease bookings (runs.services.ingest._runs_insert): the same rows and hashes."""
    # journals_start's two checks hold by construction there, so the part makes neither: each run's journal is empty
    # (the run's own row goes in in the same statement, under a new primary key) and its fence holds (its booking,
    # with that owner and epoch, goes in in the same statement, which nobody else can see before it ends).
    values, _ = _start_values(journals, now, "postgresql")
    return _START_PART, [now, _start_records(values)]


def _run(sql, params, db=None) -> list:
    """The first column of the rows `sql` returns, on the same connection and transaction as Django's cursor would
    run it: atomic blocks, savepoints and on_commit hooks see no difference, and an error comes out as Django's
    (IntegrityError, OperationalError)."""
    # On Postgres, when nothing watches the connection's statements (no debug cursor, no execute_wrappers:
    # assertNumQueries, CaptureQueriesContext, DEBUG and a wrapper such as the bench's statement count keep Django's
    # cursor), through one psycopg cursor kept for the connection, with the checks Django's cursor makes before a
    # statement: the append comes at every step, and Django's cursor made and closed around it costs the walk as much
    # Python as the append's own work.
    db = connections[DEFAULT_DB_ALIAS] if db is None else db
    if db.vendor != "postgresql" or db.queries_logged or db.execute_wrappers:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return [row[0] for row in cursor.fetchall()]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cursor = _kept_cursor(db)
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _kept_cursor(db):
    """The psycopg cursor _run keeps for the connection db holds now (a new one after a reconnect): the same class
    as Django's (the connection's cursor_factory: server-side binding, prepared after PAL's threshold)."""
    kept = getattr(db, "_journal_cursor", None)
    if kept is None or kept.closed or kept.connection is not db.connection:
        kept = db.connection.cursor()
        db._journal_cursor = kept
    return kept


def event_append(
    *,
    run_id: UUID | str,
    kind: str,
    step_id: str | None = None,
    attempt: int | None = None,
    payload: Any = None,
    writer: str = "",
    fence: Fence | None = None,
) -> int:
    return events_append(run_id=run_id, events=[NewEvent(kind, step_id, attempt, payload)], writer=writer, fence=fence)[
        0
    ]


class ReservedKind(ValueError):
    pass


def custom_event_append(*, run_id: UUID | str, kind: str, step_id: str | None, payload: Any, writer: str) -> int:
    """An event from a tool, an agent or the API: any kind but the reserved ones."""
    if kind in RESERVED_KINDS:
        raise ReservedKind(f"kind {kind!r} is reserved for the engine")
    return event_append(run_id=run_id, kind=kind, step_id=step_id, payload=payload, writer=writer)

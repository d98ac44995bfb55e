"""The one way to write the journal: event_append / events_append, fenced by the writer's lease.

Sequence numbers are allocated inside the INSERT (MAX(seq) + n for this run), so they have no gap; two
writers that race for the same seq collide on the primary key and the loser retries, so there is no repeat.
A fenced append carries the writer's (owner, epoch): it inserts only while that lease row exists with that
epoch, and takes FOR SHARE on it (Postgres) so a steal or a cancel waits for the append to commit or sees it
fail. One statement appends several events in one commit (a step's step_completed and the next step's
step_started), which is what keeps a step's overhead at one round trip.
"""

import json
import random
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from .models import RESERVED_KINDS

SEQ_RETRIES = 200


@dataclass(frozen=True)
class Fence:
    """A writer's lease: its owner name and the epoch it was granted (the fencing token)."""

    run_id: UUID
    owner: str
    epoch: int


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


def dumps(value) -> str:
    return json.dumps(value if value is not None else {}, cls=DjangoJSONEncoder, separators=(",", ":"), sort_keys=True)


def _sql(count: int, fenced: bool, vendor: str) -> str:
    pg = vendor == "postgresql"
    text, integer, jsonb = ("::text", "::integer", "::jsonb") if pg else ("", "", "")
    rows = ", ".join(f"({n}, %s{text}, %s{text}, %s{integer}, %s{jsonb})" for n in range(1, count + 1))
    ctes = ["last AS (SELECT COALESCE(MAX(seq), 0) AS seq FROM journal_events WHERE run_id = %s)"]
    sources = ["last", "v"]
    if fenced:
        # The table name is the whole coupling to runs.RunLock (the journal never imports runs).
        lock = " FOR SHARE" if pg else ""
        ctes.insert(0, f"fence AS (SELECT 1 AS ok FROM run_locks WHERE run_id = %s AND owner = %s AND epoch = %s{lock})")
        sources.append("fence")
    ctes.append(f"v(n, kind, step_id, attempt, payload) AS (VALUES {rows})")
    return (
        f"WITH {', '.join(ctes)} "
        "INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch) "
        f"SELECT %s, last.seq + v.n, v.kind, v.step_id, v.attempt, v.payload, %s, %s, %s "
        f"FROM {', '.join(sources)} "
        "RETURNING seq"
    )


def _db_uuid(value: UUID | str):
    value = value if isinstance(value, UUID) else UUID(str(value))
    return value if connection.vendor == "postgresql" else value.hex


def events_append(
    *,
    run_id: UUID | str,
    events: list[NewEvent],
    writer: str = "",
    fence: Fence | None = None,
    epoch: int | None = None,
    now: datetime | None = None,
) -> list[int]:
    """Append events in order in one statement; return their seqs. Raises FencedOut when the fence fails."""
    if not events:
        return []
    run = _db_uuid(run_id)
    # Placeholders in SQL order: fence, last, v (the values), then the SELECT list.
    params_head: list[Any] = []
    if fence is not None:
        params_head += [_db_uuid(fence.run_id), fence.owner, fence.epoch]
    params_head.append(run)
    values: list[Any] = []
    params_tail = [run, now or timezone.now(), writer, fence.epoch if fence else epoch]
    for event in events:
        values += [event.kind, event.step_id, event.attempt, dumps(event.payload)]
    params = params_head + values + params_tail
    sql = _sql(len(events), fence is not None, connection.vendor)
    for tries in range(SEQ_RETRIES):
        try:
            if tries == 0 and not connection.in_atomic_block:
                seqs = _run(sql, params)  # the fast path: one statement, one commit
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
            continue  # another writer took this seq first; recompute MAX(seq)
        if not seqs:
            raise FencedOut(fence)
        return sorted(seqs)
    raise RuntimeError(f"could not allocate a journal seq for run {run_id} after {SEQ_RETRIES} tries")


def _run(sql, params):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


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
    return events_append(
        run_id=run_id, events=[NewEvent(kind, step_id, attempt, payload)], writer=writer, fence=fence
    )[0]


class ReservedKind(ValueError):
    pass


def custom_event_append(*, run_id: UUID | str, kind: str, step_id: str | None, payload: Any, writer: str) -> int:
    """An event from a tool, an agent or the API: any kind but the reserved ones."""
    if kind in RESERVED_KINDS:
        raise ReservedKind(f"kind {kind!r} is reserved for the engine")
    return event_append(run_id=run_id, kind=kind, step_id=step_id, payload=payload, writer=writer)

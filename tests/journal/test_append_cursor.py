"""The journal append's kept psycopg cursor (journal.services._run): the same rows and hashes as through Django's
cursor, and Django's transaction state kept right around it (atomic blocks, savepoints, on_commit, errors)."""

import uuid
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.services import Fence, NewEvent, Tail, _run, events_append
from runs.models import RunLock
from tests.helpers import make_run

# autocommit, as a worker's walk runs: the fast path, which is Postgres's (elsewhere _run is Django's cursor).
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _on_postgres():
    assert connection.vendor == "postgresql", "the kept cursor is the Postgres path: this test needs DATABASE_URL"


COLUMNS = ("seq", "kind", "step_id", "attempt", "payload", "created_at", "writer", "epoch", "prev_hash", "hash")


def rows(run_id) -> list[tuple]:
    return list(JournalEvent.objects.filter(run_id=run_id).order_by("seq").values_list(*COLUMNS))


def walk_like_appends(run, fence: Fence, now: datetime) -> None:
    """What a walk of three steps appends, each step's completed with the next one's started."""
    tail = Tail()
    events_append(run_id=run.id, events=[NewEvent("note")], writer="w", fence=fence, tail=tail, now=now)
    for n in range(3):
        step = [NewEvent("step_completed", f"s{n}", 1, {"output": {"i": n}, "ms": 0.5})]
        events_append(
            run_id=run.id,
            events=[*step, NewEvent("step_started", f"s{n + 1}", 1, {"key": f"k{n}", "input": {"é": "\u2028"}})],
            writer="w",
            fence=fence,
            tail=tail,
            now=now,
        )


def test_the_kept_cursor_writes_the_same_rows_and_hashes_as_djangos_cursor():
    run = make_run()
    JournalEvent.objects.filter(run_id=run.id).delete()  # its creation's rows: the comparison starts from nothing
    lock = RunLock.objects.get(run_id=run.id)
    fence, now = Fence(run.id, lock.owner, lock.epoch), datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    walk_like_appends(run, fence, now)
    fast = rows(run.id)
    assert connection._journal_cursor.connection is connection.connection  # these went through the kept cursor
    JournalEvent.objects.filter(run_id=run.id).delete()
    with CaptureQueriesContext(connection) as seen:  # a debug cursor: Django's own path
        walk_like_appends(run, fence, now)
    slow = rows(run.id)

    assert len(seen.captured_queries) == 4  # one statement an append, counted as before
    assert fast == slow and len(fast) == 7
    assert chain_verify(run_id=run.id).ok


def test_an_append_in_an_atomic_block_that_rolls_back_leaves_nothing():
    run_id = uuid.uuid4()
    with pytest.raises(RuntimeError), transaction.atomic():
        events_append(run_id=run_id, events=[NewEvent("lost")])
        raise RuntimeError("the caller's transaction fails")

    assert rows(run_id) == []
    assert events_append(run_id=run_id, events=[NewEvent("kept")]) == [1]


def test_an_append_in_a_savepoint_rolls_back_with_it_and_the_outer_block_commits():
    run_id = uuid.uuid4()
    with transaction.atomic():
        events_append(run_id=run_id, events=[NewEvent("outer")])
        with pytest.raises(RuntimeError), transaction.atomic():
            events_append(run_id=run_id, events=[NewEvent("inner")])
            raise RuntimeError("the savepoint fails")
        events_append(run_id=run_id, events=[NewEvent("after")])

    assert [row[1] for row in rows(run_id)] == ["outer", "after"]
    assert chain_verify(run_id=run_id).ok


def test_on_commit_runs_after_the_blocks_commit_and_not_after_a_rollback():
    run_id, ran = uuid.uuid4(), []
    with transaction.atomic():
        events_append(run_id=run_id, events=[NewEvent("note")])
        transaction.on_commit(lambda: ran.append(rows(run_id)[0][1]))  # sees the committed row
        assert ran == []
    with pytest.raises(RuntimeError), transaction.atomic():
        events_append(run_id=run_id, events=[NewEvent("lost")])
        transaction.on_commit(lambda: ran.append("rolled back"))
        raise RuntimeError("the caller's transaction fails")

    assert ran == ["note"]


def test_a_database_error_comes_out_as_djangos_and_the_connection_goes_on():
    run_id = uuid.uuid4()
    events_append(run_id=run_id, events=[NewEvent("note")])
    duplicate = (
        "INSERT INTO journal_events (run_id, seq, kind, payload, created_at, writer, prev_hash, hash) "
        "VALUES (%s, 1, 'again', '{}', now(), '', '', '') RETURNING seq"
    )

    with pytest.raises(IntegrityError):
        _run(duplicate, [run_id])

    assert events_append(run_id=run_id, events=[NewEvent("next")]) == [2]


def test_a_broken_transaction_refuses_the_append_as_djangos_cursor_does():
    run_id = uuid.uuid4()
    with transaction.atomic():
        events_append(run_id=run_id, events=[NewEvent("note")])
        transaction.set_rollback(True)  # as after an error caught inside the block
        with pytest.raises(TransactionManagementError):
            events_append(run_id=run_id, events=[NewEvent("refused")])

    assert rows(run_id) == []


def test_the_append_reconnects_after_the_connection_was_closed():
    run_id = uuid.uuid4()
    events_append(run_id=run_id, events=[NewEvent("before")])
    connection.close()

    assert events_append(run_id=run_id, events=[NewEvent("after")]) == [2]
    assert chain_verify(run_id=run_id).ok


def test_an_execute_wrapper_sees_every_append():
    run_id, seen = uuid.uuid4(), []

    def count(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        events_append(run_id=run_id, events=[NewEvent("a")], tail=Tail())
        events_append(run_id=run_id, events=[NewEvent("b")])

    assert sum("INSERT INTO journal_events" in sql for sql in seen) == 2

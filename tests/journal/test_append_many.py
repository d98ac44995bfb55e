"""An append of more rows than one statement may carry (issue 23: 9,400 step_started of a wide graph passed
psycopg's 65,535 parameters and wedged the run): one append, one commit, seqs 1..n, a chain that holds."""

import pytest
from django.db import transaction

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.services import APPEND_ROWS, Fence, FencedOut, NewEvent, Tail, events_append
from runs.models import RunLock
from tests.helpers import make_run

pytestmark = pytest.mark.django_db

ROWS = 9_500  # 7 parameters a row: 66,500, past Postgres' 65,535 (and SQLite's 32,766)


def started(count: int) -> list[NewEvent]:
    return [NewEvent("step_started", f"s{n}", 1, {"key": f"k:s{n}:1", "kind": "tool_call"}) for n in range(count)]


def fence_of(run) -> Fence:
    lock = RunLock.objects.get(run_id=run.id)
    return Fence(run.id, lock.owner, lock.epoch)


def test_a_fenced_append_of_9500_rows_goes_in_whole_and_chains():
    assert ROWS > APPEND_ROWS
    run = make_run()
    tail = Tail(1, JournalEvent.objects.get(run_id=run.id, seq=1).hash)  # after run_created

    with transaction.atomic():  # as the walk commits a step's outcome and the next starts
        seqs = events_append(run_id=run.id, events=started(ROWS), writer="w", fence=fence_of(run), tail=tail)

    assert seqs == list(range(2, ROWS + 2))
    assert (tail.seq, tail.hash) == (ROWS + 1, JournalEvent.objects.get(run_id=run.id, seq=ROWS + 1).hash)
    assert JournalEvent.objects.filter(run_id=run.id).count() == ROWS + 1
    assert chain_verify(run_id=run.id).ok


def test_an_append_of_9500_rows_whose_fence_fails_writes_none_of_them():
    run = make_run()
    stale = Fence(run.id, fence_of(run).owner, fence_of(run).epoch + 1)
    with pytest.raises(FencedOut):
        events_append(run_id=run.id, events=started(ROWS), writer="w", fence=stale)
    assert JournalEvent.objects.filter(run_id=run.id).count() == 1

"""The journal append: seqs 1..n with no gap and no repeat, fenced by the writer's lease."""

import threading
import uuid

import pytest
from django.db import connection, transaction

from journal.models import JournalEvent
from journal.services import (
    Fence,
    FencedOut,
    NewEvent,
    ReservedKind,
    custom_event_append,
    event_append,
    events_append,
)
from runs import leases
from runs.models import RunLock
from tests.helpers import make_run, needs_concurrent_database

pytestmark = pytest.mark.django_db


def seqs(run_id) -> list[int]:
    return list(JournalEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


def current_fence(run) -> Fence:
    lock = RunLock.objects.get(run_id=run.id)
    return Fence(run.id, lock.owner, lock.epoch)


# --- seqs -----------------------------------------------------------------------------------------


def test_seqs_count_from_one_without_gaps():
    run_id = uuid.uuid4()
    returned = [event_append(run_id=run_id, kind="note", payload={"n": n}) for n in range(5)]
    assert returned == [1, 2, 3, 4, 5]
    assert seqs(run_id) == [1, 2, 3, 4, 5]


def test_each_run_has_its_own_sequence():
    first, second = uuid.uuid4(), uuid.uuid4()
    event_append(run_id=first, kind="note")
    event_append(run_id=first, kind="note")
    assert event_append(run_id=second, kind="note") == 1


def test_several_events_in_one_append_get_consecutive_seqs_in_order():
    run_id = uuid.uuid4()
    event_append(run_id=run_id, kind="note")
    returned = events_append(run_id=run_id, events=[NewEvent("a"), NewEvent("b", "s1", 2, {"x": 1}), NewEvent("c")])
    assert returned == [2, 3, 4]
    rows = list(JournalEvent.objects.filter(run_id=run_id, seq__gte=2).order_by("seq"))
    assert [(r.kind, r.step_id, r.attempt, r.payload) for r in rows] == [
        ("a", None, None, {}),
        ("b", "s1", 2, {"x": 1}),
        ("c", None, None, {}),
    ]


def test_an_empty_append_writes_nothing():
    run_id = uuid.uuid4()
    assert events_append(run_id=run_id, events=[]) == []
    assert seqs(run_id) == []


def test_an_append_rolled_back_with_its_transaction_leaves_no_gap():
    run_id = uuid.uuid4()
    event_append(run_id=run_id, kind="note")
    with pytest.raises(RuntimeError), transaction.atomic():
        event_append(run_id=run_id, kind="lost")
        raise RuntimeError("the caller's transaction fails")
    assert event_append(run_id=run_id, kind="note") == 2
    assert seqs(run_id) == [1, 2]


def test_a_row_records_its_writer_and_epoch():
    run = make_run()
    fence = current_fence(run)
    seq = event_append(run_id=run.id, kind="note", writer="worker-1", fence=fence)
    row = JournalEvent.objects.get(run_id=run.id, seq=seq)
    assert (row.writer, row.epoch) == ("worker-1", fence.epoch)


# --- fencing --------------------------------------------------------------------------------------


def test_a_fenced_append_with_the_current_lease_is_written():
    run = make_run()
    before = seqs(run.id)
    seq = event_append(run_id=run.id, kind="note", fence=current_fence(run))
    assert seqs(run.id) == [*before, seq]


def test_a_fenced_append_with_a_stale_epoch_raises_and_writes_nothing():
    run = make_run()
    stale = current_fence(run)
    leases.lease_reserve(run_id=run.id, task_id="thief", force=True)  # a steal: epoch + 1
    before = seqs(run.id)
    with pytest.raises(FencedOut):
        events_append(run_id=run.id, events=[NewEvent("a"), NewEvent("b")], fence=stale)
    assert seqs(run.id) == before


def test_a_fenced_append_by_another_owner_raises_and_writes_nothing():
    run = make_run()
    fence = current_fence(run)
    impostor = Fence(run.id, "task:impostor", fence.epoch)
    before = seqs(run.id)
    with pytest.raises(FencedOut):
        event_append(run_id=run.id, kind="note", fence=impostor)
    assert seqs(run.id) == before


def test_a_fenced_append_after_the_lease_was_dropped_raises_and_writes_nothing():
    run = make_run()
    fence = current_fence(run)
    leases.lease_drop(run_id=run.id)
    before = seqs(run.id)
    with pytest.raises(FencedOut):
        event_append(run_id=run.id, kind="note", fence=fence)
    assert seqs(run.id) == before


def test_fenced_out_names_the_run_and_the_epoch():
    run = make_run()
    fence = Fence(run.id, "task:impostor", 99)
    with pytest.raises(FencedOut, match=f"run {run.id} epoch 99"):
        event_append(run_id=run.id, kind="note", fence=fence)


# --- custom events --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["run_created", "step_completed", "run_redriven", "side_effect_claimed", "run_cancelled"]
)
def test_a_custom_event_of_a_reserved_kind_is_refused_and_not_written(kind):
    run_id = uuid.uuid4()
    with pytest.raises(ReservedKind, match=kind):
        custom_event_append(run_id=run_id, kind=kind, step_id=None, payload={}, writer="api")
    assert seqs(run_id) == []


def test_a_custom_event_of_another_kind_is_appended():
    run_id = uuid.uuid4()
    event_append(run_id=run_id, kind="run_created")
    seq = custom_event_append(
        run_id=run_id, kind="confidence_evaluated", step_id="draft", payload={"score": 0.9}, writer="api"
    )
    row = JournalEvent.objects.get(run_id=run_id, seq=seq)
    assert (seq, row.kind, row.step_id, row.payload, row.writer) == (
        2,
        "confidence_evaluated",
        "draft",
        {"score": 0.9},
        "api",
    )


# --- concurrency ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_appenders_produce_no_gap_and_no_repeat():
    needs_concurrent_database()
    run_id = uuid.uuid4()
    threads_count, per_thread = 6, 25
    start = threading.Barrier(threads_count)
    failures = []

    def append_many(number):
        try:
            start.wait()
            for i in range(per_thread):
                event_append(run_id=run_id, kind="tick", payload={"thread": number, "i": i}, writer=f"t{number}")
        except Exception as exc:  # reported below: an assertion in a thread would be lost
            failures.append(exc)
        finally:
            connection.close()  # each thread had its own connection

    threads = [threading.Thread(target=append_many, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    total = threads_count * per_thread
    assert seqs(run_id) == list(range(1, total + 1))
    written = sorted(
        (e["thread"], e["i"]) for e in JournalEvent.objects.filter(run_id=run_id).values_list("payload", flat=True)
    )
    assert written == sorted((t, i) for t in range(threads_count) for i in range(per_thread))

"""Runs created in bulk (issue 15 section 1: runs.services.ingest._runs_insert, used by POST /runs with one run and by
POST /runs/batch with many): one INSERT of the runs, one of their lease bookings, one of their journals' first rows,
and their tasks sent after the commit, one message per run. What each run gets must be what one run made alone gets:
the same journal row (chained from GENESIS, fenced by the booking's epoch), the same booking, the same group."""

import json
import uuid

import pytest
from django.db import transaction

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.services import GENESIS, Fence, FencedOut, NewEvent, NewJournal, journals_start, row_hash
from runs import leases
from runs.models import Run, RunLock, RunStatus
from runs.services import run_create, run_create_batch, workflow_create
from tests.helpers import drive, echo_step, make_workflow

pytestmark = pytest.mark.django_db


def items(workflow, inputs) -> list[dict]:
    return [{"workflow": workflow.name, "input": value} for value in inputs]


def test_each_run_of_a_batch_has_one_run_created_fenced_by_its_booking_and_its_chain_verifies():
    workflow = make_workflow(steps=[echo_step("only")])
    made = run_create_batch(items=items(workflow, [{"n": n} for n in range(5)]), created_by="otto")

    for run, created in made:
        assert created
        lock = RunLock.objects.get(run_id=run.id)
        assert lock.owner == run.booked_owner and lock.owner.startswith("task:") and lock.epoch == 1
        (row,) = JournalEvent.objects.filter(run_id=run.id)
        assert (row.seq, row.kind, row.epoch, row.writer, row.prev_hash) == (1, "run_created", 1, "otto", GENESIS)
        assert row.payload["input"] == run.input and row.payload["by"] == "otto"
        report = chain_verify(run_id=run.id, exact=False)
        assert report.ok and report.count == 1, report


def test_a_run_made_alone_and_one_made_in_a_batch_get_the_same_rows_but_for_their_ids_and_times():
    workflow = make_workflow(steps=[echo_step("only")])
    alone, _ = run_create(workflow_name=workflow.name, input={"a": 1}, created_by="otto")
    ((batched, _),) = run_create_batch(items=items(workflow, [{"a": 1}]), created_by="otto")

    def shape(run):
        row = JournalEvent.objects.get(run_id=run.id)
        lock = RunLock.objects.get(run_id=run.id)
        stored = Run.objects.get(id=run.id)
        return (
            (row.seq, row.kind, row.payload, row.writer, row.epoch, row.prev_hash),
            (lock.epoch, lock.owner.split(":")[0]),
            (stored.status, stored.concurrency_key, stored.depth, stored.input, stored.waiting_on),
        )

    assert shape(alone) == shape(batched)


def test_a_batch_of_a_limited_workflow_books_every_run_and_its_walks_start_only_as_many_as_the_limit(settings):
    settings.PAL_SLICE_SECONDS = 0.000001  # each task walks one step and hands the run to a new task
    workflow_create(
        definition={
            "name": "limited-batch",
            "concurrency": {"max_runs": 2, "key": "{{ input.customer }}"},
            "steps": [echo_step("s1"), echo_step("s2")],
        }
    )
    made = [
        run
        for run, _ in run_create_batch(
            items=[{"workflow": "limited-batch", "input": {"customer": "acme"}}] * 4, created_by="otto"
        )
    ]
    # As for runs made one by one (runs.concurrency): the group is fixed at creation and each first task is
    # booked; the slot is asked for when that task's walk comes.
    assert {run.concurrency_key for run in made} == {"limited-batch:acme"}
    assert RunLock.objects.filter(run_id__in=[run.id for run in made], owner__startswith="task:").count() == 4

    for run in made:
        drive(run)
    statuses = [Run.objects.get(id=run.id).status for run in made]
    assert statuses[:2] == [RunStatus.RUNNING] * 2  # the two oldest took the slots
    assert statuses[2:] == [RunStatus.QUEUED] * 2  # the others wait on the group, with no lease
    assert not RunLock.objects.filter(run_id__in=[run.id for run in made[2:]]).exists()
    assert all(Run.objects.get(id=run.id).waiting_on["kind"] == "concurrency" for run in made[2:])


def test_a_batchs_tasks_are_sent_after_its_commit_one_message_per_run_in_order(
    redis_broker, django_capture_on_commit_callbacks
):
    workflow = make_workflow(steps=[echo_step("only")])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        made = run_create_batch(items=items(workflow, [{"n": n} for n in range(30)]), created_by="otto")
        assert redis_broker.llen("celery") == 0  # nothing before the commit

    assert len(callbacks) == 1  # one send for the batch, over one producer
    sent = [json.loads(message) for message in reversed(redis_broker.lrange("celery", 0, -1))]  # LPUSH: oldest last
    assert [m["headers"]["argsrepr"] for m in sent] == [repr((str(run.id),)) for run, _ in made]
    assert [m["headers"]["id"] for m in sent] == [run.booked_owner.removeprefix("task:") for run, _ in made]
    assert {m["headers"]["task"] for m in sent} == {"runs.tasks.drive"}


def test_a_batch_that_rolls_back_sends_nothing_and_leaves_no_row(redis_broker, django_capture_on_commit_callbacks):
    workflow = make_workflow(steps=[echo_step("only")])

    class Boom(Exception):
        pass

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(Boom), transaction.atomic():
            made = run_create_batch(items=items(workflow, [{"n": n} for n in range(3)]), created_by="otto")
            raise Boom

    ids = [run.id for run, _ in made]
    assert callbacks == [] and redis_broker.llen("celery") == 0
    assert not Run.objects.filter(id__in=ids).exists()
    assert not RunLock.objects.filter(run_id__in=ids).exists()
    assert not JournalEvent.objects.filter(run_id__in=ids).exists()


def _bare_run(workflow) -> Run:
    """A run row with no lease and no journal, as _runs_insert leaves one before its bookings and rows."""
    return Run.objects.create(workflow=workflow, input={})


def test_first_rows_written_in_bulk_hash_as_one_runs_append_would():
    workflow = make_workflow(steps=[echo_step("only")])
    runs = [_bare_run(workflow), _bare_run(workflow)]
    fences = leases.lease_reserve_new(bookings=[(run.id, str(uuid.uuid4())) for run in runs])
    journals_start(
        journals=[
            NewJournal(
                runs[0].id, [NewEvent("run_created", payload={"x": 1}), NewEvent("note", "s1", 2, [1])], "w", fences[0]
            ),
            NewJournal(runs[1].id, [NewEvent("run_created", payload={"x": 2})], "w", None),
        ]
    )

    for run, epoch in ((runs[0], 1), (runs[1], None)):
        prev = GENESIS
        for row in JournalEvent.objects.filter(run_id=run.id).order_by("seq"):
            assert row.epoch == epoch and row.prev_hash == prev
            assert row.hash == row_hash(
                prev_hash=prev,
                run_id=run.id,
                seq=row.seq,
                kind=row.kind,
                step_id=row.step_id,
                attempt=row.attempt,
                payload=row.payload,
                created_at=row.created_at,
                writer=row.writer,
                epoch=row.epoch,
            )
            prev = row.hash
        assert chain_verify(run_id=run.id, exact=False).ok


def test_first_rows_are_refused_when_the_booking_is_gone_or_the_journal_is_not_empty():
    workflow = make_workflow(steps=[echo_step("only")])
    fenced, started = _bare_run(workflow), _bare_run(workflow)
    (fence,) = leases.lease_reserve_new(bookings=[(fenced.id, str(uuid.uuid4()))])
    RunLock.objects.filter(run_id=fenced.id).delete()  # dropped (a cancel) before the rows went in

    with pytest.raises(FencedOut), transaction.atomic():
        journals_start(journals=[NewJournal(fenced.id, [NewEvent("run_created")], "w", fence)])
    assert not JournalEvent.objects.filter(run_id=fenced.id).exists()

    journals_start(journals=[NewJournal(started.id, [NewEvent("run_created")], "w")])
    with pytest.raises(RuntimeError, match="did not all go in"), transaction.atomic():
        journals_start(journals=[NewJournal(started.id, [NewEvent("run_created")], "w")])
    assert JournalEvent.objects.filter(run_id=started.id).count() == 1


def test_a_stale_epoch_fences_the_first_rows_out():
    workflow = make_workflow(steps=[echo_step("only")])
    run = _bare_run(workflow)
    (fence,) = leases.lease_reserve_new(bookings=[(run.id, str(uuid.uuid4()))])
    RunLock.objects.filter(run_id=run.id).update(epoch=2)  # stolen meanwhile

    with pytest.raises(FencedOut), transaction.atomic():
        journals_start(journals=[NewJournal(run.id, [NewEvent("run_created")], "w", Fence(run.id, fence.owner, 1))])
    assert not JournalEvent.objects.filter(run_id=run.id).exists()


def test_a_new_runs_first_message_is_the_one_drive_apply_async_sends(redis_broker):
    import importlib

    from celery import signature

    from runs.dispatch import DRIVE, drives_send

    def comparable(raw: bytes) -> dict:
        message = json.loads(raw)
        message["properties"].pop("delivery_tag")  # the transport's, new for every message
        return message

    # Before and after this process loads the tasks' module (a web process may not; a worker has): apply_async
    # then sends the task's own options.
    for load in (lambda: None, lambda: importlib.import_module("runs.tasks")):
        load()
        redis_broker.flushdb()
        run_id, task_id = uuid.uuid4(), str(uuid.uuid4())
        signature(DRIVE).apply_async(args=[str(run_id)], task_id=task_id)  # a new one: it resolves its task once
        drives_send([(run_id, task_id)])

        newest, oldest = redis_broker.lrange("celery", 0, -1)  # LPUSH: the newest first
        sent, expected = comparable(newest), comparable(oldest)
        assert sent["headers"] == expected["headers"]
        assert sent == expected and sent["headers"]["id"] == task_id

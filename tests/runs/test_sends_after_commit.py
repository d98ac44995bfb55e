"""Every task PAL Ops sends goes after its transaction's commit; when the broker is away at that moment the send is
logged with what sends it again, never raised into the request or the worker's task whose work is committed
(runs.dispatch._after_commit). tests/durability/test_broker_away.py shows the same through a real web server."""

import logging
import uuid

import pytest
from celery import current_app
from django.db import transaction
from kombu import Connection, pools

from runs import dispatch
from runs.models import Run, RunLock, RunStatus
from runs.services import run_create
from tests.helpers import echo_step, make_workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_away(monkeypatch):
    """This process's producers publish to a port where no broker listens (a real connection attempt each)."""
    away = pools.ProducerPool(Connection("redis://127.0.0.1:1/0", connect_timeout=1).Pool(limit=2), limit=2)
    monkeypatch.setattr(current_app.amqp, "_producer_pool", away)
    yield
    away.force_close_all()


SENDS = {
    "drive": (
        lambda run_id: dispatch.enqueue_drive(run_id=run_id, task_id=str(uuid.uuid4()), priority=0),
        "drive task not sent",
        "the sweep sends it again once its booking expires",
    ),
    "item": (
        lambda run_id: dispatch.enqueue_item(run_id=run_id, sid="fan.0", task_id=str(uuid.uuid4())),
        "task of fan-out item fan.0 not sent",
        "the walk takes the item back once its booking expires",
    ),
    "wake": (
        lambda run_id: dispatch.enqueue_wake(run_id=run_id, countdown=5),
        "wake-up not sent",
        "the sweep wakes it once it is due",
    ),
}


@pytest.mark.parametrize("name", sorted(SENDS))
def test_a_send_that_fails_after_the_commit_is_logged_with_what_sends_it_again(
    name, broker_away, caplog, django_capture_on_commit_callbacks
):
    send, said, then = SENDS[name]
    run_id = uuid.uuid4()
    caplog.set_level(logging.WARNING, logger="pal.dispatch")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            send(run_id)

    assert callbacks, "nothing was deferred to the commit"
    [record] = [r for r in caplog.records if r.name == "pal.dispatch"]
    message = record.getMessage()
    assert message.startswith(f"run {run_id}: {said} (OperationalError: ")
    assert message.endswith(f"); {then}")


def test_a_run_created_while_the_broker_is_away_is_made_booked_and_logged(
    broker_away, caplog, django_capture_on_commit_callbacks
):
    make_workflow(name="away", steps=[echo_step("only")])
    caplog.set_level(logging.WARNING, logger="pal.dispatch")
    with django_capture_on_commit_callbacks(execute=True):
        run, _ = run_create(workflow_name="away", input={})

    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED
    assert RunLock.objects.get(run_id=run.id).owner.startswith("task:")
    [message] = [r.getMessage() for r in caplog.records if r.name == "pal.dispatch"]
    assert message.startswith(f"run {run.id}: drive task not sent (OperationalError: ")


def test_the_bulk_and_sweep_sends_fail_quietly_too(broker_away, caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.WARNING, logger="pal.dispatch")
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            dispatch.enqueue_bulk(bulk_id=7)
            dispatch.enqueue_sweep()

    messages = [r.getMessage() for r in caplog.records if r.name == "pal.dispatch"]
    said = [m.split(" (")[0] for m in messages]
    assert said == ["bulk action 7: task not sent", "sweep at a lease's expiry not sent"]
    assert messages[0].endswith("the sweep sends it again") and messages[1].endswith("the beat's next tick sweeps")


def test_a_rollback_sends_nothing_and_logs_nothing(broker_away, caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.WARNING, logger="pal.dispatch")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            dispatch.enqueue_drive(run_id=uuid.uuid4(), task_id=str(uuid.uuid4()), priority=0)
            raise RuntimeError("rolled back")
    assert callbacks == []
    assert [r for r in caplog.records if r.name == "pal.dispatch"] == []

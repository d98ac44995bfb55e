"""The web process's DriveSender (runs.dispatch): the drive messages of the runs its requests make are sent by one
thread of its own, several at a time, after each request's commit; each message is the one the request itself
would have sent, a failure is logged with the request's own line, a rollback sends nothing, and what is waiting
when the process ends is sent. tests/durability/test_broker_away.py shows the same through a real web server."""

import json
import logging
import os
import threading
import time
import uuid

import pytest
from celery import current_app
from celery.signals import before_task_publish
from django.db import transaction
from kombu import Connection, pools
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from pal import telemetry
from runs import dispatch
from runs.models import Run, RunLock, RunStatus
from runs.services import run_create, run_create_batch
from tests.helpers import echo_step, make_workflow

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit runs at each real commit


@pytest.fixture
def sender():
    started = dispatch.drive_sender_start()
    yield started
    dispatch.drive_sender_stop()


def _sent(redis_broker, count: int) -> list[dict]:
    """The messages on the drive queue, oldest first, once there are count of them (the sender's thread sends)."""
    deadline = time.monotonic() + 10
    while redis_broker.llen("celery") < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return [json.loads(raw) for raw in reversed(redis_broker.lrange("celery", 0, -1))]  # LPUSH: newest first


def _comparable(message: dict) -> dict:
    message = json.loads(json.dumps(message))
    message["properties"].pop("delivery_tag")  # the transport's, new for every message
    return message


def test_runs_made_while_a_sender_runs_get_the_message_each_would_have_sent_itself(redis_broker, sender):
    workflow = make_workflow(name="sent", steps=[echo_step("only")])

    one, _ = run_create(workflow_name="sent", input={"n": 0})
    batch = run_create_batch(items=[{"workflow": "sent", "input": {"n": n}} for n in (1, 2, 3)], created_by="otto")

    made = [one, *(run for run, _ in batch)]
    sent = _sent(redis_broker, 4)
    assert [m["headers"]["argsrepr"] for m in sent] == [repr((str(run.id),)) for run in made]
    assert [m["headers"]["id"] for m in sent] == [run.booked_owner.removeprefix("task:") for run in made]
    assert [RunLock.objects.get(run_id=run.id).owner for run in made] == [run.booked_owner for run in made]
    # Byte for byte (but the transport's delivery tag) what drives_send sends for the same booking in the request.
    dispatch.drive_sender_stop()
    redis_broker.flushdb()
    dispatch.drives_send([(one.id, one.booked_owner.removeprefix("task:"))])
    (direct,) = _sent(redis_broker, 1)
    assert _comparable(direct) == _comparable(sent[0])
    assert workflow.name == "sent"


def test_the_sender_takes_every_booking_waiting_into_one_send(redis_broker, sender, monkeypatch):
    calls = []
    real = dispatch.drives_send
    monkeypatch.setattr(
        dispatch, "drives_send", lambda bookings, **kw: (calls.append(len(bookings)), real(bookings, **kw))
    )
    bookings = [[(uuid.uuid4(), str(uuid.uuid4()))] for _ in range(5)]

    sender.waiting.put(None)  # hold the thread: it ends at the first None...
    sender.thread.join(5)
    assert not sender.thread.is_alive()
    restarted = dispatch.drive_sender_start()  # ...and a new one starts with five bookings already waiting
    for each in bookings:
        restarted.waiting.put((each, f"run {each[0][0]}: drive task", (None, current_app.thread_oid)))
    restarted.stop()

    assert sum(calls) == 5 and len(calls) < 5, calls
    assert len(_sent(redis_broker, 5)) == 5


def test_a_rollback_hands_the_sender_nothing(redis_broker, sender):
    make_workflow(name="undone", steps=[echo_step("only")])

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        run, _ = run_create(workflow_name="undone", input={})
        raise Boom

    sender.stop()
    assert redis_broker.llen("celery") == 0
    assert not Run.objects.filter(id=run.id).exists() and not RunLock.objects.filter(run_id=run.id).exists()


def test_a_send_that_fails_logs_each_requests_own_line_and_the_runs_stay_booked(monkeypatch, caplog, sender):
    away = pools.ProducerPool(Connection("redis://127.0.0.1:1/0", connect_timeout=1).Pool(limit=2), limit=2)
    monkeypatch.setattr(current_app.amqp, "_producer_pool", away)
    caplog.set_level(logging.WARNING, logger="pal.dispatch")
    make_workflow(name="away", steps=[echo_step("only")])
    try:
        one, _ = run_create(workflow_name="away", input={})
        batch = [run for run, _ in run_create_batch(items=[{"workflow": "away"}] * 2, created_by="otto")]
        sender.stop(timeout=30)
    finally:
        away.force_close_all()

    said = [r.getMessage() for r in caplog.records if r.name == "pal.dispatch"]
    assert any(m.startswith(f"run {one.id}: drive task not sent (OperationalError: ") for m in said), said
    many = f"runs {batch[0].id}, {batch[1].id}: drive tasks (some or all) not sent (OperationalError: "
    assert any(m.startswith(many) for m in said), said
    assert all(m.endswith("; the sweep sends it again once its booking expires") for m in said), said
    for run in [one, *batch]:
        assert Run.objects.get(id=run.id).status == RunStatus.QUEUED
        assert RunLock.objects.get(run_id=run.id).owner.startswith("task:")  # the sweep's to re-drive at expiry


def test_stop_sends_what_is_waiting(redis_broker, sender):
    make_workflow(name="last", steps=[echo_step("only")])
    made = [run_create(workflow_name="last", input={"n": n})[0] for n in range(20)]

    dispatch.drive_sender_stop()  # what atexit does at the process's end

    assert redis_broker.llen("celery") == 20
    assert {json.loads(m)["headers"]["id"] for m in redis_broker.lrange("celery", 0, -1)} == {
        run.booked_owner.removeprefix("task:") for run in made
    }


def test_each_message_is_published_in_the_trace_context_of_the_request_that_made_its_run(
    redis_broker, sender, monkeypatch
):
    provider = TracerProvider()
    monkeypatch.setattr(telemetry, "_tracer", provider.get_tracer("test"))
    make_workflow(name="traced", steps=[echo_step("only")])
    seen = {}

    def publishing(sender=None, headers=None, **kwargs):
        seen[headers["id"]] = trace.get_current_span().get_span_context().trace_id

    before_task_publish.connect(publishing, weak=False)
    try:
        made = {}
        for n in range(3):
            with telemetry._tracer.start_as_current_span(f"request {n}") as span:
                run, _ = run_create(workflow_name="traced", input={"n": n})
                made[run.booked_owner.removeprefix("task:")] = span.get_span_context().trace_id
        dispatch.drive_sender_stop()
    finally:
        before_task_publish.disconnect(publishing)

    assert seen == made and len(set(made.values())) == 3


def test_a_forked_child_sends_per_transaction_not_through_its_parents_thread(sender):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's queue came along, its thread did not
        os.write(write, b"none" if dispatch._sender is None else b"kept")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 4) == b"none"
    assert dispatch._sender is sender and sender.thread.is_alive()


def test_a_request_that_finds_the_backlog_full_sends_its_own_message_at_once(redis_broker, sender, monkeypatch):
    monkeypatch.setattr(sender, "BACKLOG", 2)
    real, gate = dispatch.drives_send, threading.Event()

    def drives_send(bookings, **kw):
        if threading.current_thread() is sender.thread:
            assert gate.wait(10), "the test never let the sender's thread go"
        return real(bookings, **kw)

    monkeypatch.setattr(dispatch, "drives_send", drives_send)
    make_workflow(name="pressed", steps=[echo_step("only")])
    waiting = [run_create(workflow_name="pressed", input={"n": n})[0] for n in range(2)]
    assert sender.backlog == 2  # handed to the thread, which is held before its send
    assert redis_broker.llen("celery") == 0

    third, _ = run_create(workflow_name="pressed", input={"n": 2})

    # Sent by the request itself, before it returned, while the two before it still wait for the thread.
    (own,) = [json.loads(raw) for raw in redis_broker.lrange("celery", 0, -1)]
    assert own["headers"]["id"] == third.booked_owner.removeprefix("task:")
    assert sender.backlog == 2
    gate.set()
    sent = {m["headers"]["id"] for m in _sent(redis_broker, 3)}
    assert sent == {run.booked_owner.removeprefix("task:") for run in [*waiting, third]}
    dispatch.drive_sender_stop()
    assert sender.backlog == 0

"""A run's priority (-100..100, higher sooner, as Django's tasks have it): its drive message's broker priority
(Redis: lower number sooner, a message without one at 0; RabbitMQ: higher sooner, x-max-priority on the queue),
priority 0 sent exactly as before; the order a freed concurrency slot and a paced resume take waiting runs in."""

import json
import os
import subprocess

import pytest
from django.test import override_settings

from runs.dispatch import broker_priority
from runs.errors import Conflict, ServiceError
from runs.models import Run, RunLock, RunStatus
from runs.services import pause_create, pause_resume, run_create, workflow_create
from runs.services.ingest import run_create_batch
from tests.helpers import drive, echo_step, make_run, make_workflow
from tests.support.workers import REPO_ROOT, python_executable

REDIS = "redis://127.0.0.1:6379/0"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.parametrize(
    ("broker", "levels"),
    [
        # Redis: an unprioritised message is at 0, its first list; only a run below 0 has a place, after it.
        (REDIS, {100: None, 50: None, 1: None, 0: None, -1: 1, -12: 1, -13: 2, -50: 5, -100: 9}),
        # RabbitMQ: an unprioritised message is at 0, its lowest; only a run above 0 has a place, before it.
        (RABBITMQ, {100: 9, 50: 5, 13: 2, 12: 1, 1: 1, 0: None, -1: None, -100: None}),
        ("filesystem://", {100: None, 0: None, -100: None}),
    ],
)
def test_a_runs_priority_maps_to_its_brokers_message_priority(broker, levels):
    with override_settings(CELERY_BROKER_URL=broker):
        assert {priority: broker_priority(priority) for priority in levels} == levels


@pytest.mark.django_db
def test_a_priority_outside_django_s_range_is_refused_naming_the_field():
    make_workflow(steps=[echo_step("a")], name="ranked")
    for bad in (101, -101, 1.5, True, "high"):
        with pytest.raises(ServiceError) as caught:
            run_create(workflow_name="ranked", priority=bad)
        assert caught.value.status == 422 and caught.value.detail.startswith("priority:"), caught.value.detail
    with pytest.raises(ServiceError) as caught:
        run_create_batch(items=[{"workflow": "ranked"}, {"workflow": "ranked", "priority": 500}], created_by="t")
    assert caught.value.detail.startswith("runs[1].priority:")
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_same_idempotency_key_with_another_priority_is_another_body():
    make_workflow(steps=[echo_step("a")], name="ranked")
    first, _ = run_create(workflow_name="ranked", idempotency_key="k", priority=5)
    again, created = run_create(workflow_name="ranked", idempotency_key="k", priority=5)
    assert again.id == first.id and not created and first.priority == 5
    with pytest.raises(Conflict):
        run_create(workflow_name="ranked", idempotency_key="k", priority=6)


@pytest.mark.django_db(transaction=True)
def test_a_runs_drive_message_goes_to_its_priority_s_redis_list_and_priority_0_as_before(redis_broker):
    make_workflow(steps=[echo_step("a")], name="ranked")
    run_create(workflow_name="ranked")
    run_create(workflow_name="ranked", priority=50)
    assert redis_broker.llen("celery") == 2  # priority 0 and above: the list every message went to before
    low, _ = run_create(workflow_name="ranked", priority=-50)
    assert redis_broker.llen("celery") == 2 and redis_broker.llen("celery\x06\x165") == 1
    message = json.loads(redis_broker.lindex("celery\x06\x165", 0))
    assert message["properties"]["priority"] == 5 and message["headers"]["argsrepr"] == repr((str(low.id),))
    unprioritised = json.loads(redis_broker.lindex("celery", 0))
    assert unprioritised["properties"].get("priority") in (None, 0)  # as every message was sent before


@pytest.mark.django_db
def test_a_freed_concurrency_slot_goes_to_the_highest_priority_then_the_oldest(settings):
    settings.PAL_SLICE_SECONDS = 0.000001  # each task walks one step and hands the run to a new task
    workflow_create(
        definition={"name": "one-at-a-time", "concurrency": {"max_runs": 1}, "steps": [echo_step("a"), echo_step("b")]}
    )
    first, _ = run_create(workflow_name="one-at-a-time")
    drive(first)  # takes the slot, walks a step, hands itself on
    waiting = [
        run_create(workflow_name="one-at-a-time", priority=priority)[0] for priority in (0, -10, 10, 0, 10)
    ]  # fmt: skip
    for run in waiting:
        drive(run)
        assert run.status == RunStatus.QUEUED and run.waiting_on["kind"] == "concurrency", run.waiting_on
    order = []
    current = first
    while True:
        while current.status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            drive(current)
        booked = RunLock.objects.filter(run_id__in=[r.id for r in waiting], owner__startswith="task:").first()
        if booked is None:
            break
        current = next(r for r in waiting if r.id == booked.run_id)
        current.refresh_from_db()
        order.append(current)
    # 10 (the older first), then 0 (the older first), then -10.
    assert [waiting.index(r) for r in order] == [2, 4, 0, 3, 1]


@pytest.mark.django_db(transaction=True)
def test_a_paced_resume_gives_the_highest_priority_its_turn_first_then_the_oldest():
    workflow = make_workflow(steps=[echo_step("a")])
    pause = pause_create(scope="workflow", target=workflow.name, by="alice", reason="hold")
    runs = [make_run(workflow=workflow) for _ in range(4)]
    Run.objects.filter(id=runs[3].id).update(priority=20)
    Run.objects.filter(id=runs[0].id).update(priority=-20)
    for run in runs:
        drive(run)
    pause_resume(pause_id=pause.id, by="alice", reason="go", per_second=2)
    for run in runs:
        run.refresh_from_db()
    assert [runs.index(r) for r in sorted(runs, key=lambda r: r.wake_at)] == [3, 1, 2, 0]


@pytest.mark.parametrize(
    ("broker", "expected"),
    [(RABBITMQ, {"x-max-priority": 9}), (REDIS, None)],
)
def test_the_queue_is_declared_with_x_max_priority_on_rabbitmq_and_redis_has_ten_lists(broker, expected):
    """The settings of a new process on that broker (nothing is connected to)."""
    script = (
        "import json, django; django.setup(); from django.conf import settings; from pal.celery import app; "
        "q = app.amqp.queues[app.conf.task_default_queue]; "
        "print(json.dumps([q.queue_arguments, getattr(settings, 'CELERY_BROKER_TRANSPORT_OPTIONS', None)]))"
    )
    env = {**os.environ, "CELERY_BROKER_URL": broker, "DJANGO_SETTINGS_MODULE": "pal.settings"}
    env.setdefault("DJANGO_SECRET_KEY", "test-only-insecure-key")
    done = subprocess.run(
        [python_executable(), "-c", script], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    arguments, options = json.loads(done.stdout.strip().splitlines()[-1])
    assert arguments == expected
    if broker == REDIS:
        assert options == {"priority_steps": list(range(10))}


@pytest.mark.django_db
def test_a_run_inserted_by_code_that_predates_priority_gets_0_from_the_database():
    """During a rolling upgrade a process of the code before 0025 inserts runs with no priority column."""
    from django.db import connection

    run = make_run(steps=[echo_step("a")])
    columns = ", ".join(f.column for f in Run._meta.concrete_fields if f.column not in ("id", "priority"))
    copy = "00000000-0000-0000-0000-0000000000aa"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO runs (id, {columns}) SELECT %s, {columns} FROM runs WHERE id = %s",
            [Run._meta.pk.get_db_prep_value(copy, connection), Run._meta.pk.get_db_prep_value(run.id, connection)],
        )
    assert Run.objects.get(id=copy).priority == 0

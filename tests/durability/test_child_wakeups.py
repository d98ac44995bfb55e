"""Whenever a child ends or wakes, its parent moves (issue 10 section 6).

A wake-up between the commit of a child's parking and its parent's (a 50 ms durable timer fires there often) used
to flip the child, skip the parent that was still running, and leave the parent parked on a child that nobody
drives: both stuck for ever. And a waiting child that an operator re-drove ended on its own, leaving its parent
parked on it for ever.
"""

import time

import pytest
from django.utils import timezone

from runs.models import FINAL_STATUSES, Run, RunStatus
from runs.recovery import sweep_once
from runs.services import run_create, run_redrive, workflow_create
from tests.helpers import QUICK, describe, echo, events, wait_for_end, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TREES = 200


def test_hundreds_of_parents_whose_child_parks_on_a_50_ms_timer_all_finish_on_several_workers(celery_workers):
    for name in ("wake-a", "wake-b"):
        celery_workers(name=name, concurrency=2, **QUICK)
    workflow_create(
        definition={"name": "nap-child", "steps": [{"id": "nap", "kind": "sleep", "seconds": 0.05}, echo("woke")]}
    )
    workflow_create(
        definition={
            "name": "nap-parent",
            "steps": [{"id": "sub", "kind": "child_run", "workflow": "nap-child", "input": {}}, echo("after")],
        }
    )
    parents = [run_create(workflow_name="nap-parent", input={"i": i})[0] for i in range(TREES)]
    ids = [p.id for p in parents]

    deadline = time.monotonic() + 240
    while Run.objects.filter(id__in=ids).exclude(status__in=FINAL_STATUSES).exists():
        assert time.monotonic() < deadline, "\n\n".join(
            describe(r) for r in Run.objects.filter(id__in=ids).exclude(status__in=FINAL_STATUSES)[:3]
        )
        sweep_once(who="test-beat")  # the beat: it also wakes a parent left on a child that moved
        time.sleep(0.5)

    for parent in Run.objects.filter(id__in=ids):
        assert parent.status == RunStatus.SUCCEEDED, describe(parent)
        assert parent.output == {"done": True}
        (child,) = Run.objects.filter(parent_run_id=parent.id)
        assert child.status == RunStatus.SUCCEEDED, describe(child)
        assert len(events(child, "step_completed", "woke")) == 1, describe(child)


def test_an_operators_redrive_of_a_waiting_child_that_then_ends_moves_its_parent(celery_workers, redis_broker):
    worker = celery_workers(name="wake-op", **QUICK)
    workflow_create(
        # 6 s: the worker must be killed before the child's timer fires, and on a loaded machine getting there from
        # the child's parking can take more than a second or two.
        definition={"name": "due-child", "steps": [{"id": "nap", "kind": "sleep", "seconds": 6}, echo("woke")]}
    )
    parent = run_create(workflow_name="due-child", input={})[0]  # placeholder to warm the worker
    wait_for_end(parent, timeout=60)
    workflow_create(
        definition={
            "name": "due-parent",
            "steps": [{"id": "sub", "kind": "child_run", "workflow": "due-child", "input": {}}, echo("after")],
        }
    )
    parent = run_create(workflow_name="due-parent", input={})[0]
    wait_until(
        lambda: Run.objects.filter(id=parent.id, status=RunStatus.WAITING).exists(),
        timeout=30,
        what="the parent to wait on its child",
        explain=lambda: describe(parent),
    )
    child = Run.objects.get(parent_run_id=parent.id)
    assert child.status == RunStatus.WAITING
    worker.kill()  # its wake-up task goes with the broker's contents: only the operator moves the child now
    redis_broker.flushdb()
    celery_workers(name="wake-op-2", **QUICK)
    due = Run.objects.get(id=child.id).wake_at
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.2)  # the child's timer is due

    run_redrive(run_id=child.id, by="alice", reason="its timer never fired")

    child = wait_for_end(child, timeout=30)
    parent = wait_for_end(parent, timeout=30)  # no sweep: the child's ending moved it
    assert child.status == RunStatus.SUCCEEDED, describe(child)
    assert parent.status == RunStatus.SUCCEEDED, describe(parent)
    assert parent.output == {"done": True}
    assert len(events(parent, "step_completed", "sub")) == 1, describe(parent)

"""A lease that nobody walks must not stay alive (issue 10 section 5).

The heartbeat extends exactly the (run, epoch) pairs a walk in its process is using, never an expired one; and a
database error under a walk stops the walk without a step_failed or run_failed, leaving the run to the sweep.
Both tests keep the same worker busy with other runs ("under load"): a heartbeat that extended every lease in its
process's name kept the abandoned lease alive for as long as that process held any other.
"""

import pytest
from django.db import connection

from runs.models import Run, RunStatus
from runs.services import run_redrive, workflow_create
from tests.helpers import (
    QUICK,
    describe,
    echo,
    events,
    sleep_tool,
    start_run,
    sweep_until_end,
    wait_for_event,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _load(count: int, *, steps: int = 6, seconds: float = 1.0) -> list[Run]:
    """Runs that keep the worker's processes walking (and so heartbeating) for a while."""
    return [start_run(*[sleep_tool(f"s{i}", seconds) for i in range(steps)]) for _ in range(count)]


def test_a_parent_whose_child_was_force_redriven_under_load_finishes_after_its_lease_expires(celery_workers):
    celery_workers(name="holes-a", concurrency=2, **QUICK)
    workflow_create(definition={"name": "holes-child", "steps": [sleep_tool("long", 4), echo("child-after")]})
    parent = start_run({"id": "sub", "kind": "child_run", "workflow": "holes-child", "input": {}}, echo("after"))
    wait_until(
        lambda: Run.objects.filter(parent_run_id=parent.id).exists(),
        timeout=30,
        what="the child to exist",
        explain=lambda: describe(parent),
    )
    child = Run.objects.get(parent_run_id=parent.id)
    wait_for_event(child, "step_started", "long", timeout=30)
    load = _load(3)

    # The operator steals the child from its parent's walk: that walk is fenced out and gives up the parent too.
    run_redrive(run_id=child.id, by="alice", reason="unstick the child", force=True)

    parent = sweep_until_end(parent, timeout=90)
    child.refresh_from_db()
    assert parent.status == RunStatus.SUCCEEDED, describe(parent)
    assert child.status == RunStatus.SUCCEEDED, describe(child)
    assert parent.output == {"done": True}
    assert len(events(child, "step_completed", "long")) == 1, describe(child)
    assert len(events(child, "step_completed", "child-after")) == 1, describe(child)
    assert events(parent, "step_failed") == [] and events(child, "step_failed") == []
    for run in load:
        assert sweep_until_end(run, timeout=90).status == RunStatus.SUCCEEDED, describe(run)


def test_a_database_failure_under_a_walk_is_not_the_steps_failure_and_the_sweep_finishes_the_run(celery_workers):
    celery_workers(name="holes-b", concurrency=1, **QUICK)
    run = start_run(sleep_tool("long", 3), echo("after"))
    wait_for_event(run, "step_started", "long", timeout=30)
    load = _load(1, steps=8)  # queued behind it on the same process: it keeps that process's heartbeat going

    # Every connection to the test database but ours dies: the worker finds out at its next write.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    run = sweep_until_end(run, timeout=90)
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"done": True}
    assert events(run, "step_failed") == [] and events(run, "run_failed") == [], describe(run)
    assert len(events(run, "step_completed", "long")) == 1, describe(run)
    assert len(events(run, "run_redriven")) >= 1, describe(run)  # the sweep, once the lease expired
    assert sweep_until_end(load[0], timeout=90).status == RunStatus.SUCCEEDED, describe(load[0])

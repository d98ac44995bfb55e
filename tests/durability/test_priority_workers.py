"""Run priorities on real workers (Redis): one worker busy, low-priority tasks and then a high-priority one
enqueued through django.tasks (task.using(priority=...)): the high one starts before the low ones; and a
concurrency group of one: of the runs waiting for its slot, the high-priority one gets it first."""

import pytest

from runs.models import Run, RunStatus
from runs.services import run_create, workflow_create
from tests.code import sample_workflows  # noqa: F401  the gate tool (hold_until), registered here too
from tests.helpers import QUICK, describe, events, wait_for_end, wait_until
from tests.tasks import sample_tasks

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CODE = {"PAL_WORKFLOW_MODULES": "tests.code.sample_workflows"}


def gated(name: str, **definition) -> None:
    """A workflow whose one step holds its worker until the file input.gate exists."""
    step = {"id": "hold", "kind": "tool_call", "tool": "hold_until", "args": {"path": "{{ input.gate }}"}}
    workflow_create(definition={"name": name, "steps": [step], **definition})


def holding(run: Run) -> bool:
    run.refresh_from_db()
    return run.status == RunStatus.RUNNING and bool(events(run, "step_started"))


def finished(result):
    wait_until(lambda: result.refresh() or result.is_finished, timeout=60, what=f"task {result.id} to finish")
    return result


def test_a_high_priority_task_starts_before_the_low_priority_ones_enqueued_before_it(celery_workers, tmp_path):
    celery_workers(CODE, name="one", concurrency=1, **QUICK)  # one process: one run at a time
    gate = tmp_path / "gate"
    gated("busy")
    busy = run_create(workflow_name="busy", input={"gate": str(gate)})[0]
    wait_until(lambda: holding(busy), timeout=60, what="the worker to be busy", explain=lambda: describe(busy))

    low = [sample_tasks.add.using(priority=-50).enqueue(n, n) for n in range(4)]
    high = sample_tasks.add.using(priority=50).enqueue(100, 1)
    gate.touch()

    for result in [*low, high]:
        finished(result)
    assert high.return_value == 101 and [r.return_value for r in low] == [0, 2, 4, 6]
    assert high.task.priority == 50 and {r.task.priority for r in low} == {-50}  # read back by get_result
    assert high.started_at < min(r.started_at for r in low)
    assert sorted(low, key=lambda r: r.started_at) == low  # the low ones in the order they were enqueued


def test_a_high_priority_run_waiting_for_a_concurrency_slot_gets_it_before_older_ones(celery_workers, tmp_path):
    celery_workers(CODE, name="slots", concurrency=2, **QUICK)
    gate, open_gate = tmp_path / "gate", tmp_path / "open"
    open_gate.touch()
    gated("one-slot", concurrency={"max_runs": 1})
    holder = run_create(workflow_name="one-slot", input={"gate": str(gate)})[0]
    wait_until(lambda: holding(holder), timeout=60, what="the slot's holder to run", explain=lambda: describe(holder))

    def queued_on_the_slot(run: Run) -> bool:
        run.refresh_from_db()
        return run.status == RunStatus.QUEUED and (run.waiting_on or {}).get("kind") == "concurrency"

    low = [run_create(workflow_name="one-slot", input={"gate": str(open_gate), "n": n})[0] for n in range(3)]
    high = run_create(workflow_name="one-slot", input={"gate": str(open_gate), "n": 9}, priority=10)[0]
    for run in [*low, high]:
        wait_until(lambda run=run: queued_on_the_slot(run), timeout=60, what=f"run {run.id} to wait for the slot")
    gate.touch()

    for run in [holder, *low, high]:
        assert wait_for_end(run, timeout=60).status == RunStatus.SUCCEEDED, describe(run)
    assert high.started_at < min(run.started_at for run in low), [holder.started_at, high.started_at] + [
        run.started_at for run in low
    ]
    assert sorted(low, key=lambda run: run.started_at) == low  # then the others, oldest first

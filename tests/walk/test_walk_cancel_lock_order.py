"""A queued run's first walk (runs.walk.walk.Walk.go) holding its group's row and a cancel of that run, on Postgres:
the walk must hold its lease row before the group's row, as the cancel does (run_locks, runs, concurrency_keys)."""

import threading

import pytest

import runs.walk.walk as executor  # where the walk takes its slot
from runs.models import Run, RunStatus
from runs.services import run_cancel, run_create, workflow_create
from runs.walk import run_drive
from tests.helpers import booked_task_id, echo_step
from tests.services.test_wake_cancel_lock_order import _a_lock_wait_in_this_database, _in_thread

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_queued_runs_first_walk_paused_holding_its_groups_row_and_a_cancel_of_it_both_finish(monkeypatch):
    workflow_create(definition={"name": "capped", "concurrency": {"max_runs": 2}, "steps": [echo_step("a")]})
    run, _ = run_create(workflow_name="capped", input={})
    task = booked_task_id(run)
    locked, go_on = threading.Event(), threading.Event()
    take = executor.slot_take

    def take_then_pause(r):
        out = take(r)
        if threading.current_thread().name == "walk" and not locked.is_set():
            locked.set()
            assert go_on.wait(timeout=30)
        return out

    monkeypatch.setattr(executor, "slot_take", take_then_pause)
    outcome = {}
    walk = _in_thread(lambda: run_drive(run_id=run.id, task_id=task), outcome, "walk")
    cancel = _in_thread(lambda: run_cancel(run_id=run.id, by="alice", reason="no").status, outcome, "cancel")
    walk.start()
    assert locked.wait(timeout=30)
    cancel.start()
    for _ in range(600):
        if _a_lock_wait_in_this_database() or not cancel.is_alive():
            break
        cancel.join(timeout=0.05)
    go_on.set()
    walk.join(timeout=60), cancel.join(timeout=60)
    assert outcome["cancel"] == RunStatus.CANCELLED and not isinstance(outcome["walk"], Exception), outcome
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED

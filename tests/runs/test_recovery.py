"""The recovery sweep: re-drives live runs that no live lease holds, exactly once, and nothing else."""

import threading

import pytest
from django.db import connection

from journal.models import JournalEvent
from runs import leases
from runs.models import Run, RunLock, RunStatus, Sweep
from runs.recovery import redrive_one, sweep_once
from runs.services import run_cancel
from tests.helpers import (
    booked_task_id,
    calls,
    drive,
    echo_step,
    events,
    expire_lease,
    kinds,
    make_run,
    make_workflow,
    needs_concurrent_database,
    record_drive_sends,
    step_events,
    tool_step,
)

pytestmark = pytest.mark.django_db


def crashed_run():
    """A running run whose worker died in its second step, still holding the lease."""
    run = make_run(steps=[tool_step("a", "test_count"), tool_step("b", "test_crash_once"), echo_step("c")])
    with pytest.raises(BaseException, match="crash in b"):
        drive(run)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    return run


# --- what the sweep picks up ----------------------------------------------------------------------


def test_the_sweep_redrives_a_running_run_whose_lease_expired():
    run = crashed_run()
    dead_worker = RunLock.objects.get(run_id=run.id).owner
    expire_lease(run)

    sweep = sweep_once()

    assert sweep.redriven == [str(run.id)]
    redriven = events(run)[-1]
    assert redriven.kind == "run_redriven"
    assert (redriven.payload["by"], redriven.payload["why"], redriven.writer) == ("sweep", "no live lease", "sweep")
    assert redriven.payload["previous_lease"]["owner"] == dead_worker
    assert RunLock.objects.get(run_id=run.id).owner == f"task:{redriven.payload['task_id']}"


def test_the_sweep_books_a_new_epoch_and_sends_the_task_after_commit(monkeypatch, django_capture_on_commit_callbacks):
    run = crashed_run()
    old_epoch = RunLock.objects.get(run_id=run.id).epoch
    expire_lease(run)
    sent = record_drive_sends(monkeypatch)

    with django_capture_on_commit_callbacks(execute=True):
        sweep_once()

    assert RunLock.objects.get(run_id=run.id).epoch == old_epoch + 1
    assert sent == [{"run_id": str(run.id), "task_id": booked_task_id(run), "countdown": None}]


def test_a_redriven_run_goes_on_from_its_interrupted_step():
    run = crashed_run()
    expire_lease(run)
    sweep_once()
    drive(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(run)] == ["a", "b", "b"]


def test_a_queued_run_whose_first_task_was_lost_is_redriven_once_its_booking_expired():
    run = make_run()
    expire_lease(run)
    assert sweep_once().redriven == [str(run.id)]
    drive(run)
    assert run.status == RunStatus.SUCCEEDED


def test_a_running_run_with_no_lease_at_all_is_redriven():
    run = crashed_run()
    leases.lease_drop(run_id=run.id)
    assert sweep_once().redriven == [str(run.id)]


def test_the_sweep_records_what_it_examined():
    stuck, _fine = make_run(), make_run()
    expire_lease(stuck)
    sweep = sweep_once(who="beat")
    assert (sweep.who, sweep.examined, sweep.redriven) == ("beat", 1, [str(stuck.id)])
    assert sweep.finished_at is not None
    assert Sweep.objects.filter(id=sweep.id).exists()


# --- what the sweep leaves alone ------------------------------------------------------------------


def test_the_sweep_leaves_a_run_with_a_live_lease_alone():
    run = crashed_run()  # the worker may only be slow: its lease has not expired
    before = kinds(run)
    assert sweep_once().redriven == []
    assert kinds(run) == before


def test_a_queued_run_inside_its_booking_grace_period_is_not_redriven():
    run = make_run()  # its first task may still be in the broker
    task_id = booked_task_id(run)
    assert sweep_once().redriven == []
    assert booked_task_id(run) == task_id
    assert kinds(run) == ["run_created"]


def test_the_sweep_leaves_finished_runs_alone():
    succeeded = make_run(steps=[echo_step("a")])
    drive(succeeded)
    failed = make_run(steps=[tool_step("a", "test_fail")])
    drive(failed)
    cancelled = make_run()
    run_cancel(run_id=cancelled.id, by="alice", reason="not needed")
    assert {r.status for r in (succeeded, failed)} == {RunStatus.SUCCEEDED, RunStatus.FAILED}

    sweep = sweep_once()

    assert (sweep.examined, sweep.redriven) == (0, [])
    assert not JournalEvent.objects.filter(kind="run_redriven").exists()


def test_the_sweep_leaves_a_waiting_run_alone():
    run = make_run()
    leases.lease_drop(run_id=run.id)
    Run.objects.filter(id=run.id).update(status=RunStatus.WAITING)
    assert sweep_once().redriven == []
    assert step_events(run, "run_redriven") == []


def test_a_second_sweep_does_not_redrive_a_run_the_first_one_booked():
    run = crashed_run()
    expire_lease(run)
    assert sweep_once().redriven == [str(run.id)]
    assert sweep_once().redriven == []
    assert len(step_events(run, "run_redriven")) == 1


def test_a_run_that_ended_after_the_sweep_listed_it_is_not_redriven():
    # The sweep lists stuck runs, then books them one by one; a slow worker whose lease had expired may
    # finish the run in between. redrive_one is that second half.
    run = make_run(steps=[echo_step("a")])
    drive(run)
    before = kinds(run)
    assert redrive_one(run_id=run.id, who="sweep", why="no live lease") is False
    assert kinds(run) == before
    assert not RunLock.objects.filter(run_id=run.id).exists()


# --- racing sweeps --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_racing_redrive_each_run_exactly_once(monkeypatch):
    needs_concurrent_database()
    sent = record_drive_sends(monkeypatch)  # transaction=True: the on-commit sends really happen
    workflow = make_workflow(steps=[echo_step("a")])
    runs = [make_run(workflow=workflow) for _ in range(20)]
    for run in runs:
        expire_lease(run)  # every first task was lost
    start = threading.Barrier(2)
    sweeps, failures = [], []

    def sweep():
        try:
            start.wait()
            sweeps.append(sweep_once())
        except Exception as exc:  # reported below: an assertion in a thread would be lost
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    first, second = (set(s.redriven) for s in sweeps)
    assert first.isdisjoint(second)
    assert first | second == {str(r.id) for r in runs}
    redriven = JournalEvent.objects.filter(kind="run_redriven")
    assert sorted(str(e.run_id) for e in redriven) == sorted(str(r.id) for r in runs)
    redrive_tasks = {e.payload["task_id"] for e in redriven}
    assert sorted(s["task_id"] for s in sent if s["task_id"] in redrive_tasks) == sorted(redrive_tasks)

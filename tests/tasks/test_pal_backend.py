"""Django's task framework on PAL Ops (pal.tasks.PalBackend), through the public django.tasks API only, with real
workers: an enqueued task is a durable run, read back with get_result / refresh; a rolled-back atomic() makes no
run; run_after is a durable timer; a kill -9 mid-task re-runs it under the same idempotency key."""

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from runs.recovery import sweep_once
from tests.helpers import QUICK, wait_until
from tests.tasks import sample_tasks

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def finished(result, timeout=60, *, sweep=False):
    """Poll result.refresh() until the task has finished. With sweep, play the beat between looks: a killed
    worker's run is the sweep's to re-drive."""

    def done():
        if sweep:
            sweep_once(who="test-beat")
        result.refresh()
        return result.is_finished

    wait_until(
        done,
        timeout=timeout,
        what=f"task {result.id} to finish",
        explain=lambda: f"{result.status}; errors {result.errors}; workers {result.worker_ids}",
    )
    return result


def test_an_enqueued_task_is_a_run_that_a_worker_finishes(celery_workers):
    celery_workers(name="tasks", **QUICK)
    seen = []
    task_enqueued.connect(lambda sender, task_result, **kw: seen.append(task_result.id), weak=False)
    result = sample_tasks.add.enqueue(2, 3)
    assert type(task_backends["default"]).__name__ == "PalBackend"
    assert result.status == TaskResultStatus.READY
    assert (result.task, result.args, result.kwargs, result.backend) == (sample_tasks.add, [2, 3], {}, "default")
    assert result.started_at is None and result.finished_at is None and result.worker_ids == []
    stored = default_task_backend.get_result(result.id)
    assert (stored.task, stored.args, stored.enqueued_at) == (sample_tasks.add, [2, 3], result.enqueued_at)
    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == [] and len(result.worker_ids) == 1 and result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    again = sample_tasks.add.get_result(result.id)
    assert (again.status, again.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert seen == [result.id]  # task_enqueued once, after the commit


def test_a_task_that_raises_is_failed_with_its_exception(celery_workers):
    celery_workers(name="tasks", **QUICK)
    result = finished(sample_tasks.refuse.enqueue("no stock"))
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert "refused: no stock" in error.traceback
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018 (Django raises for a result that did not succeed)


def test_an_enqueue_inside_a_rolled_back_atomic_makes_no_run(celery_workers):
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        result = sample_tasks.add.enqueue(1, 1)
        raise Undo
    with pytest.raises(TaskResultDoesNotExist):
        sample_tasks.add.get_result(result.id)


def test_run_after_waits_on_a_durable_timer(celery_workers):
    celery_workers(name="tasks", **QUICK)
    later = timezone.now() + timedelta(seconds=3)
    result = sample_tasks.add.using(run_after=later).enqueue(4, 4)
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.started_at is None
    finished(result)
    assert result.return_value == 8
    assert result.started_at >= later - timedelta(seconds=1)


def test_a_worker_killed_mid_task_runs_it_again_under_the_same_key(celery_workers, tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()
    victim = celery_workers(name="victim", **QUICK)
    result = sample_tasks.charge.enqueue(str(calls), 4.0)
    wait_until(lambda: list(calls.iterdir()), timeout=30, what="the first call")
    victim.kill()
    celery_workers(name="survivor", **QUICK)
    finished(result, timeout=90, sweep=True)
    keys = [p.read_text() for p in calls.iterdir()]
    assert len(keys) == 2 and len(set(keys)) == 1, keys  # a second call, with the first one's key
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"charged": True, "key": keys[0], "run": result.id}
    assert result.attempts == len(result.worker_ids) == 2
    assert result.started_at < result.last_attempted_at <= result.finished_at  # the second call, after the kill


def test_an_unknown_result_id_is_refused():
    for unknown in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(unknown)


def signals(folder, result_id) -> list[tuple[str, str, object]]:
    """(signal, status, return value) of each task signal the workers sent for that task, in order."""
    notes = sorted(folder.iterdir(), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    return [
        (p.name.split("-")[0], p.name.split("-")[-2], json.loads(p.read_text())) for p in notes if result_id in p.name
    ]


def test_task_started_and_finished_fire_once_on_the_worker(celery_workers, tmp_path):
    folder = tmp_path / "signals"
    folder.mkdir()
    celery_workers({"PAL_TEST_SIGNAL_DIR": str(folder)}, name="signals", **QUICK)
    done = finished(sample_tasks.add.enqueue(20, 22))
    failed = finished(sample_tasks.refuse.enqueue("late"))
    wait_until(lambda: len(signals(folder, failed.id)) == 2, timeout=10, what="the failed task's signals")
    assert signals(folder, done.id) == [("started", "RUNNING", None), ("finished", "SUCCESSFUL", 42)]
    assert signals(folder, failed.id) == [("started", "RUNNING", None), ("finished", "FAILED", None)]


def test_a_task_called_again_after_a_kill_is_started_once(celery_workers, tmp_path):
    folder, calls = tmp_path / "signals", tmp_path / "calls"
    folder.mkdir()
    calls.mkdir()
    env = {"PAL_TEST_SIGNAL_DIR": str(folder)}
    victim = celery_workers(env, name="victim", **QUICK)
    result = sample_tasks.charge.enqueue(str(calls), 3.0)
    wait_until(lambda: list(calls.iterdir()), timeout=30, what="the first call")
    victim.kill()
    celery_workers(env, name="survivor", **QUICK)
    finished(result, timeout=90, sweep=True)
    wait_until(lambda: len(signals(folder, result.id)) == 2, timeout=10, what="the signals")
    seen = signals(folder, result.id)
    assert [(name, status) for name, status, _ in seen] == [("started", "RUNNING"), ("finished", "SUCCESSFUL")]


@pytest.mark.parametrize("kill_at", ["after task_called", "before the outcome"])
def test_a_worker_killed_around_the_call_fires_task_started_and_task_finished_once(kill_at, celery_workers, tmp_path):
    """The worker kills itself (kill -9 of its group) once: right after the call's task_called row commits and
    before task_started is sent; or after the call returned and before its outcome commits."""
    folder, calls, kills = tmp_path / "signals", tmp_path / "calls", tmp_path / "kills"
    for made in (folder, calls, kills):
        made.mkdir()
    env = {"PAL_TEST_SIGNAL_DIR": str(folder), "PAL_TEST_KILL_DIR": str(kills), "PAL_TEST_KILL_AT": kill_at}
    victim = celery_workers(env, name="victim", **QUICK)
    result = sample_tasks.charge.enqueue(str(calls), 0.1)
    wait_until(lambda: not victim.alive, timeout=60, what=f"the worker to kill itself {kill_at}")
    victim.kill()  # reaped
    called_before_the_kill = len(list(calls.iterdir()))
    assert called_before_the_kill == (1 if kill_at == "before the outcome" else 0)
    celery_workers(env, name="survivor", **QUICK)
    finished(result, timeout=90, sweep=True)
    wait_until(lambda: len(signals(folder, result.id)) >= 2, timeout=10, what="the signals")
    keys = [p.read_text() for p in calls.iterdir()]
    assert len(keys) == called_before_the_kill + 1 and len(set(keys)) == 1, keys  # called again, the same key
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    charged = {"charged": True, "key": keys[0], "run": result.id}
    assert signals(folder, result.id) == [("started", "RUNNING", None), ("finished", "SUCCESSFUL", charged)]

"""Two real `celery -A pal beat` processes fire an every-minute schedule over real minutes, through two real
workers, and one beat is killed with SIGKILL on the way: each fire time still makes exactly one run.

Both beats send `runs.tasks.schedules_fire` every 10 s, so the workers run schedule_fire_due twice per tick,
often at the same moment; the conditional advance of next_fire_at and the Idempotency-Key
`schedule:{id}:{fire time}` must leave one run per minute. About three minutes of wall time.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from datetime import UTC, timedelta
from pathlib import Path

import pytest

from runs.models import Run, RunStatus, ScheduleEvent
from runs.schedules import fire_key, schedule_create
from runs.services import workflow_create
from tests.helpers import QUICK, wait_until
from tests.support import workers as worker_support

pytestmark = pytest.mark.integration

FIRES = 2


def start_beat(env: dict[str, str], tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                worker_support.python_executable(),
                *("-m", "celery", "-A", "pal", "beat", "--loglevel", "INFO"),
                *("-s", str(tmp_path / f"{name}-schedule")),
            ],
            cwd=worker_support.REPO_ROOT,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log_path


def kill9(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def sent_fires(log_path: Path) -> int:
    return log_path.read_text(errors="replace").count("Sending due task schedules-fire")


@pytest.mark.timeout(420)
def test_two_beats_and_a_kill_9_of_one_make_one_run_per_fire_time(worker_env, celery_workers, tmp_path):
    workflow_create(
        definition={"name": "every-minute", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )
    schedule = schedule_create(workflow="every-minute", cron="* * * * *", by="test")
    celery_workers(name="sched-w1", **QUICK)
    celery_workers(name="sched-w2", **QUICK)
    beats = [start_beat(worker_env, tmp_path, name) for name in ("beat-1", "beat-2")]

    def fired() -> list[ScheduleEvent]:
        return list(ScheduleEvent.objects.filter(schedule_id=schedule.id, kind="fired").order_by("fire_at"))

    try:
        wait_until(lambda: len(fired()) >= 1, timeout=100, what="the first fire")
        wait_until(lambda: sent_fires(beats[0][1]) >= 1, timeout=30, what="beat-1 sending a fire")
        kill9(beats[0][0])  # the scheduler dies; the other one goes on alone
        wait_until(lambda: len(fired()) >= FIRES, timeout=200, what=f"{FIRES} fires")
        kill9(beats[1][0])
        time.sleep(1)  # a fire task already sent may still be running on a worker
    finally:
        for proc, log_path in beats:
            kill9(proc)
            print(f"----- {log_path.name} -----\n{log_path.read_text(errors='replace')[-3000:]}")

    events = fired()
    runs = list(Run.objects.filter(idempotency_key__startswith=f"schedule:{schedule.id}:"))
    fire_times = [e.fire_at for e in events]
    assert len(fire_times) == len(set(fire_times)) >= FIRES
    assert sorted(r.idempotency_key for r in runs) == sorted(fire_key(schedule.id, at) for at in fire_times)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(fire_times))
    assert all(at.astimezone(UTC).second == 0 for at in fire_times)
    assert sent_fires(beats[1][1]) > len(fire_times)  # the survivor sent far more ticks than there were fires
    wait_until(
        lambda: all(r.status == RunStatus.SUCCEEDED for r in Run.objects.filter(id__in=[r.id for r in runs])),
        timeout=60,
        what="the scheduled runs to finish",
    )

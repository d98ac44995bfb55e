"""The recovery sweep against real workers and real concurrent sweepers: it re-drives exactly the runs
that no live lease holds, each exactly once."""

import base64
import json
import subprocess
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.models import Run, RunLock, RunStatus, Sweep
from runs.recovery import sweep_once
from tests.helpers import (
    LEASE_TTL,
    QUICK,
    assert_gap_free,
    describe,
    echo,
    events,
    sleep_tool,
    start_run,
    sweep_until_end,
    wait_for_event,
)
from tests.support.workers import REPO_ROOT, python_executable

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def queued_drive_tasks(redis_broker) -> list[str]:
    """The run ids of the drive tasks waiting in the broker's default queue."""
    run_ids = []
    for raw in redis_broker.lrange("celery", 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == "runs.tasks.drive"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        run_ids.append(args[0])
    return run_ids


def test_a_queued_run_whose_broker_message_was_lost_is_redriven_once_its_booking_expires(
    celery_workers, redis_broker, settings
):
    settings.PAL_LEASE_TTL = 6  # a booking that outlives the early sweep below on a slow machine too
    run = start_run(echo("only", lost=False))
    booking = RunLock.objects.get(run_id=run.id)
    assert queued_drive_tasks(redis_broker) == [str(run.id)]
    redis_broker.flushdb()  # the broker lost the message

    early = sweep_once(who="test-beat")
    assert early.finished_at < booking.expires_at, "the sweep was too slow to test a live booking"
    assert str(run.id) not in early.redriven
    assert events(run, "run_redriven") == []
    assert RunLock.objects.get(run_id=run.id).epoch == booking.epoch

    celery_workers(name="late", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"lost": False}
    first = events(run, "run_redriven")[0]
    assert first.payload["by"] == "sweep"
    assert first.payload["previous_lease"]["owner"] == booking.owner
    assert first.created_at >= booking.expires_at
    assert_gap_free(run)


def test_the_sweep_leaves_a_run_whose_worker_holds_a_live_lease(celery_workers):
    worker = celery_workers(name="busy", **QUICK)
    run = start_run(sleep_tool("long", 5), echo("after"))
    started = wait_for_event(run, "step_started", "long")
    holder = RunLock.objects.get(run_id=run.id)
    assert holder.owner.startswith("busy:")

    sweeps = []
    while Run.objects.get(id=run.id).status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        sweeps.append(sweep_once(who="test-beat"))
        assert len(sweeps) < 200, describe(run)
        time.sleep(0.2)
    run.refresh_from_db()

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert not [s for s in sweeps if str(run.id) in s.redriven]
    assert events(run, "run_redriven") == []
    # The step outlived the lease TTL several times over: only the heartbeat kept the sweep away.
    completed = events(run, "step_completed", "long")[0]
    late = [
        s
        for s in sweeps
        if started.created_at + timedelta(seconds=LEASE_TTL + 0.5) < s.started_at < completed.created_at
    ]
    assert late, f"no sweep ran after the first lease would have expired; sweeps at {[s.started_at for s in sweeps]}"
    assert worker.alive
    assert_gap_free(run)


RACER = """
import json, os, sys, time
import django
django.setup()
from runs.recovery import sweep_once
go, who = sys.argv[1], sys.argv[2]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
record = sweep_once(who=who)
print(json.dumps(record.redriven), flush=True)
"""


def test_two_sweep_processes_racing_redrive_each_stuck_run_exactly_once(worker_env, redis_broker, tmp_path):
    runs = [start_run(echo("only", n=n)) for n in range(20)]
    redis_broker.flushdb()  # no worker runs them: they are stuck once their bookings expire
    # Half look queued with a lost message, half running with a worker that died holding the lease.
    past = timezone.now() - timedelta(seconds=5)
    RunLock.objects.filter(run_id__in=[r.id for r in runs[:10]]).update(expires_at=past)
    Run.objects.filter(id__in=[r.id for r in runs[10:]]).update(status=RunStatus.RUNNING)
    RunLock.objects.filter(run_id__in=[r.id for r in runs[10:]]).update(owner="dead-host:1:deadbeef", expires_at=past)
    epochs = dict(RunLock.objects.values_list("run_id", "epoch"))

    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [python_executable(), "-c", RACER, str(go), f"racer-{n}"],
            cwd=REPO_ROOT,
            # No sweep planned at the next lease expiry: a pass that ends over PAL_RECOVERY_INTERVAL after its first
            # re-drive (a loaded machine) would queue a sweep task beside the drive tasks counted below.
            env={**worker_env, "PAL_SWEEP_AT_LEASE_EXPIRY": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (1, 2)
    ]
    try:
        for racer in racers:
            line = racer.stdout.readline()
            assert line.strip() == "ready", f"racer did not start: {line!r} {racer.stderr.read()}"
        go.touch()  # both start their sweep at the same moment
        results = []
        for racer in racers:
            out, err = racer.communicate(timeout=60)
            assert racer.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
            racer.communicate()  # reap it and close its pipes

    ids = {str(r.id) for r in runs}
    first, second = results
    # Both saw runs as stuck that the other re-drove: they really raced (examined counts what each read).
    examined = list(Sweep.objects.filter(who__startswith="racer-").values_list("examined", flat=True))
    assert len(examined) == 2 and sum(examined) > 20, f"the two sweeps did not overlap (examined {examined})"
    assert not set(first) & set(second), f"both racers re-drove {set(first) & set(second)}"
    assert sorted(first + second) == sorted(ids)
    for run in runs:
        redriven = events(run, "run_redriven")
        assert len(redriven) == 1, describe(run)
        assert (redriven[0].payload["by"], redriven[0].writer) == ("sweep", "sweep")
        assert RunLock.objects.get(run_id=run.id).epoch == epochs[run.id] + 1
        assert_gap_free(run)
    # One drive task per run went to the broker.
    assert sorted(queued_drive_tasks(redis_broker)) == sorted(ids)


def test_a_sweep_is_not_held_up_by_a_frozen_holder_inside_a_transaction(worker_env, redis_broker):
    # A worker frozen (SIGSTOP, a long GC pause) between two statements of one of its transactions (a
    # side-effect claim, a handoff) keeps its lock on the run_locks row while its lease expires. The holder
    # is played here by a connection of this process, so the moment is exact.
    frozen_run = start_run(echo("only"))
    other_run = start_run(echo("only"))
    RunLock.objects.update(expires_at=timezone.now() - timedelta(seconds=5))
    holding, release, sweeps = threading.Event(), threading.Event(), []

    def frozen_holder():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM run_locks WHERE run_id = %s FOR SHARE", [frozen_run.id])
                holding.set()
                release.wait(60)
        finally:
            connection.close()

    def sweeper():
        try:
            sweeps.append(sweep_once(who="test-beat"))
        finally:
            connection.close()

    holder = threading.Thread(target=frozen_holder, daemon=True)
    holder.start()
    assert holding.wait(10)
    sweep = threading.Thread(target=sweeper, daemon=True)
    sweep.start()
    try:
        sweep.join(15)
        stalled = sweep.is_alive()
    finally:
        release.set()
        holder.join(10)
        sweep.join(30)

    assert not stalled, "the sweep waited on the frozen holder's row lock instead of moving on"
    assert str(other_run.id) in sweeps[0].redriven, "a run behind the frozen one was not re-driven"
    assert len(events(other_run, "run_redriven")) == 1

"""Waiting and cancel with real workers (issue 5): a durable timer survives a worker killed with -9, and a
cancel stops a long tool step on a live worker through its heartbeat.

No beat process runs: the test plays the beat scheduler with sweep_once() (tests.helpers.sweep_until_end).
"""

import pytest

from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.services import run_cancel
from tests.helpers import (
    assert_gap_free,
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


def test_a_sleep_timer_survives_its_worker_killed_with_minus_nine_and_the_run_finishes_once(celery_workers):
    first = celery_workers(name="timer-a")
    run = start_run({"id": "nap", "kind": "sleep", "seconds": 3}, echo("after", woke=True))

    wait_until(
        lambda: Run.objects.filter(id=run.id, status=RunStatus.WAITING).exists(),
        timeout=30,
        what="the run to wait on its timer",
        explain=lambda: describe(run),
    )
    run.refresh_from_db()
    assert run.waiting_on["kind"] == "timer" and run.wake_at is not None, describe(run)
    assert not RunLock.objects.filter(run_id=run.id).exists(), describe(run)  # no worker holds it while it sleeps
    first.kill()  # the wake-up task (sent with a countdown) may die with it
    celery_workers(name="timer-b")
    run = sweep_until_end(run, timeout=60)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"woke": True}
    (completed,) = events(run, "step_completed", "nap")
    assert completed.payload["output"] == {"slept": 3}
    assert len(events(run, "step_started", "nap")) == 1, describe(run)
    assert len(events(run, "step_completed", "after")) == 1, describe(run)
    assert_gap_free(run)


def test_a_cancel_during_a_long_tool_step_stops_the_worker_and_the_run_stays_cancelled(celery_workers):
    worker = celery_workers(name="cancel-a")
    run = start_run(sleep_tool("long", 30), echo("after"))
    wait_for_event(run, "step_started", "long", timeout=30)

    run_cancel(run_id=run.id, by="alice", reason="taking too long")

    # The worker's heartbeat finds the lease gone and the sleeping tool stops at its next nap: well before the
    # 30 seconds the step would take (a bounded wait, not a timing assertion).
    worker.wait_for_log(rf"run {run.id}: .*stopping without writing", timeout=15)
    # The worker is free again: it takes and finishes another run.
    other = start_run(echo("only", ok=True))
    wait_until(
        lambda: Run.objects.filter(id=other.id, status=RunStatus.SUCCEEDED).exists(),
        timeout=30,
        what="the worker to finish another run after the cancel",
        explain=lambda: describe(other),
    )
    sweep_once(who="test-beat")  # nothing to recover: a cancelled run has ended

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, describe(run)
    rows = events(run)
    (cancelled,) = [e for e in rows if e.kind == "run_cancelled"]
    assert cancelled.payload == {"by": "alice", "reason": "taking too long", "who": "alice", "why": "taking too long"}
    assert [e.kind for e in rows if e.seq > cancelled.seq] == [], describe(run)
    assert events(run, "step_completed") == [], describe(run)
    assert events(run, "step_started", "after") == [], describe(run)
    assert not RunLock.objects.filter(run_id=run.id).exists(), describe(run)
    assert_gap_free(run)

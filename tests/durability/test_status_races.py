"""A cancel and a re-drive sent at the same moment (issue 10 section 2): every status change is a conditional
write naming the status it expects, so a cancelled run stays cancelled and journals nothing after run_cancelled.

150 runs wait on an approval (a waiting run has no lease row, so only the run row's condition orders the two);
for each, one thread cancels while another force-re-drives, released together by a barrier. A real worker takes
every drive task the winning re-drives sent.
"""

import threading
import time

import pytest
from django.db import connection

from runs.models import Run, RunLock, RunStatus
from runs.services import Conflict, run_cancel, run_create, run_redrive, workflow_create
from tests.helpers import QUICK, describe, events, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RUNS = 150


def _in_thread(barrier: threading.Barrier, call, results: list, name: str, *, lag: float = 0.0):
    def body():
        try:
            barrier.wait(timeout=10)
            time.sleep(lag)  # a head start of a few milliseconds for the other, on every other run
            call()
            results.append((name, "ok"))
        except Conflict as exc:
            results.append((name, exc.code))
        finally:
            connection.close()  # each thread has its own connection: close it, or the test database stays busy

    return threading.Thread(target=body)


def test_a_cancel_racing_a_forced_redrive_leaves_every_run_cancelled_with_nothing_after_it(
    celery_workers, redis_broker
):
    celery_workers(name="races", concurrency=2, **QUICK)
    workflow_create(
        definition={
            "name": "race-approval",
            "steps": [
                {"id": "review", "kind": "approval", "prompt": "ship it?"},
                {"id": "after", "kind": "tool_call", "tool": "echo", "args": {"done": True}},
            ],
        }
    )
    runs = [run_create(workflow_name="race-approval", input={"i": i})[0] for i in range(RUNS)]
    wait_until(
        lambda: Run.objects.filter(id__in=[r.id for r in runs], status=RunStatus.WAITING).count() == RUNS,
        timeout=120,
        what=f"{RUNS} runs to wait on their approval",
    )

    outcomes = []
    for number, run in enumerate(runs):
        barrier = threading.Barrier(2)
        # Half the runs give the re-drive a head start of 3 ms, half the cancel: both orders must then occur, so
        # the test proves each is safe rather than hoping the scheduler made both happen.
        cancel_lag, redrive_lag = (0.003, 0.0) if number % 2 else (0.0, 0.003)
        results: list = []
        threads = [
            _in_thread(
                barrier,
                lambda r=run: run_cancel(run_id=r.id, by="alice", reason="not needed"),
                results,
                "cancel",
                lag=cancel_lag,
            ),
            _in_thread(
                barrier,
                lambda r=run: run_redrive(run_id=r.id, by="bob", reason="kick it", force=True),
                results,
                "redrive",
                lag=redrive_lag,
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        outcomes.append(dict(results))

    assert all(o.get("cancel") == "ok" for o in outcomes), outcomes  # the cancel always wins or comes second

    # Let the worker take every drive task a winning re-drive sent (each finds its run cancelled).
    def settled():
        return redis_broker.llen("celery") == 0 and not RunLock.objects.filter(run_id__in=[r.id for r in runs]).exists()

    wait_until(
        settled,
        timeout=60,
        what="the worker to take every drive task",
        explain=lambda: (
            f"queue length {redis_broker.llen('celery')}; leases left: "
            f"{list(RunLock.objects.filter(run_id__in=[r.id for r in runs]).values_list('run_id', 'owner', 'epoch'))}"
        ),
    )
    time.sleep(1.0)  # a task taken just now may still be walking: give it its moment, then look
    redriven_first = 0
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED, describe(run)
        kinds = [event.kind for event in events(run)]
        cancelled_at = kinds.index("run_cancelled")
        assert kinds[cancelled_at + 1 :] == [], describe(run)
        redriven_first += "run_redriven" in kinds[:cancelled_at]
    # Both orders happened: a cancel after a re-drive that won, and one that came first (the re-drive refused).
    assert 0 < redriven_first < RUNS, f"re-drive journaled before the cancel in {redriven_first} of {RUNS} runs"

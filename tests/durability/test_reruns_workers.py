"""Reruns on real workers (issue 27, section 3): 20 runs failed at a webhook step while the receiver was down; it
comes back and a rerun at 5 a second from the failed step makes every run succeed, the receiver getting each call
exactly once more (the same key: the outcome was unknown) and never more than about 5 new calls in a second by its
own clock; a kill -9 of the worker in the middle of a rerun changes nothing: each run is rerun exactly once."""

import uuid

import pytest

from runs.models import Rerun, RerunStatus, Run, RunStatus
from runs.recovery import sweep_once
from runs.services import rerun_start, workflow_create
from runs.services.ingest import run_create
from tests.helpers import QUICK, describe, echo, events, key, wait_for_end, wait_until, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# One try a call and no retry of an unknown outcome: a run fails at once while the receiver is down.
ONE_TRY = {"PAL_TRANSPORT_RETRIES": "0", "PAL_UNKNOWN_RETRIES": "0"}


@pytest.fixture(autouse=True)
def _sweep_grace(settings):
    """The test plays the beat: its sweeps send a rerun's task again after the workers' grace (2 s), not 30 s."""
    settings.PAL_RECOVERY_INTERVAL = 1


def failed_at_the_webhook(receiver, n: int) -> tuple[str, list[Run]]:
    """n runs of a new workflow (echo, then a webhook), each failed at the webhook while the receiver was down."""
    name = f"reruns-{uuid.uuid4().hex[:10]}"
    workflow_create(definition={"name": name, "steps": [echo("prepare"), webhook("notify", receiver.url, {})]})
    receiver.unavailable = True
    runs = [run_create(workflow_name=name, input={"n": index})[0] for index in range(n)]
    for index, run in enumerate(runs):
        runs[index] = run = wait_for_end(run, timeout=90)
        assert run.status == RunStatus.FAILED, describe(run)
        assert (run.error["step_id"], run.error["code"]) == ("notify", "webhook_unavailable")
    assert receiver.deliveries == [] and len(receiver.requests) == n
    receiver.unavailable = False  # it is back
    return name, runs


def rerun_of(name: str, **options) -> Rerun:
    return rerun_start(
        filter={"workflow": name, "step_id": "notify", "error_code": "webhook_unavailable"},
        from_step="failed",
        reason="the receiver was down",
        by="alice",
        name="INC-42 receiver outage",
        **options,
    )


def all_succeeded(runs: list[Run]) -> bool:
    return Run.objects.filter(id__in=[run.id for run in runs], status=RunStatus.SUCCEEDED).count() == len(runs)


def rerun_rows(run: Run, rerun: Rerun) -> list:
    return [e for e in events(run, "run_retried") if (e.payload.get("rerun_job") or {}).get("id") == str(rerun.id)]


def test_a_paced_rerun_from_the_failed_step_delivers_each_call_once_at_most_five_a_second(
    celery_workers, webhook_receiver
):
    env = {**webhook_receiver.env(), **ONE_TRY}
    celery_workers(env, name="rerun-a", concurrency=2, **QUICK)
    celery_workers(env, name="rerun-b", concurrency=2, **QUICK)
    name, runs = failed_at_the_webhook(webhook_receiver, 20)
    failed_calls = len(webhook_receiver.requests)

    rerun = rerun_of(name, per_second=5)
    assert rerun.count == 20

    wait_until(lambda: all_succeeded(runs), timeout=90, what="every run to succeed", explain=lambda: describe(runs[-1]))
    for run in runs:
        assert len(rerun_rows(run, rerun)) == 1
    rerun.refresh_from_db()
    assert (rerun.status, rerun.done, rerun.refused) == (RerunStatus.DONE, 20, 0)
    # Each call exactly once more, under the key it had: its outcome was unknown, so the retry keeps the attempt.
    assert len(webhook_receiver.requests) - failed_calls == 20
    assert webhook_receiver.dedup == {key(run, "notify"): 1 for run in runs}
    arrivals = sorted(request.received_at for request in webhook_receiver.deliveries)
    busiest = max(sum(1 for t in arrivals if start <= t < start + 1.0) for start in arrivals)
    print(f"rerun at 5/s: 20 calls over {arrivals[-1] - arrivals[0]:.2f}s, at most {busiest} in any second")
    assert busiest <= 6  # 5 a second, and one for the jitter between a turn and its worker's call


def test_a_kill_9_of_the_worker_mid_rerun_reruns_each_run_exactly_once(celery_workers, webhook_receiver):
    env = {**webhook_receiver.env(), **ONE_TRY}
    first = celery_workers(env, name="rerun-kill-a", concurrency=2, **QUICK)
    name, runs = failed_at_the_webhook(webhook_receiver, 10)

    rerun = rerun_of(name, per_second=2)
    wait_until(lambda: Rerun.objects.get(id=rerun.id).done >= 3, timeout=60, what="the rerun to reach its third run")
    first.kill()  # kill -9 mid-job: its next turn's message, and any walk it was on, die with it
    celery_workers(env, name="rerun-kill-b", concurrency=2, **QUICK)

    def over() -> bool:
        sweep_once(who="test-beat")  # the beat: sends the rerun's task again, re-drives the runs the kill left
        return (
            Rerun.objects.get(id=rerun.id).status == RerunStatus.DONE
            and not Run.objects.filter(
                id__in=[run.id for run in runs], status__in=(RunStatus.RUNNING, RunStatus.QUEUED)
            ).exists()
        )

    wait_until(over, timeout=120, what="the rerun to finish and its runs to end")
    rerun.refresh_from_db()
    assert (rerun.done, rerun.refused, rerun.count) == (10, 0, 10)
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, describe(run)
        assert len(rerun_rows(run, rerun)) == 1  # rerun once, whatever the kill interrupted
    # Every call went out under its key; one the kill cut off after sending went again with the same key.
    assert set(webhook_receiver.dedup) == {key(run, "notify") for run in runs}
    print(f"deliveries per key after the kill: {sorted(webhook_receiver.dedup.values())}")

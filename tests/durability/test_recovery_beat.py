"""Recovery that does not depend on the worker that died (issue 23 section 6): 2 workers and a real
`celery -A pal beat`, PAL_LEASE_TTL = 5 s; kill -9 of the worker that holds the run and, where there is one, the
early sweep's countdown message. The beat plans that sweep itself, so the run resumes about a TTL after the kill,
whichever worker died. The beat's regular tick is 3 TTLs apart: at interval = TTL it came soon enough after the
lease's expiry that the lost early sweep hardly showed (5.0-7.5 s on the code before; 10.1, 6.8, 6.4 s with this
test's 15 s interval and the victim started alone, so that it holds every countdown planned before the kill)."""

import time

import pytest

from journal.models import JournalEvent
from runs.services import run_cancel
from tests.helpers import QUICK, echo, sleep_tool, start_run, wait_until
from tests.support.workers import start_beat, stop_beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TTL = 5


@pytest.fixture(autouse=True)
def _lease_ttl(settings):
    settings.PAL_LEASE_TTL = TTL


def test_the_run_resumes_a_ttl_after_the_death_of_the_worker_that_holds_it_and_the_sweep(
    celery_workers, worker_env, tmp_path
):
    # The regular sweep ticks once an hour here: a run that resumes was swept by the beat's look at the lease's
    # expiry, since the early sweep a countdown would have planned died with the victim.
    env = {"PAL_LEASE_TTL": str(TTL), "PAL_RECOVERY_INTERVAL": "3600"}
    beat = start_beat({**worker_env, **env}, tmp_path / "beat")
    figures = []
    try:
        for number in range(3):
            # The victim alone first: the run and any early sweep's countdown it plans are held by it. The survivor
            # starts only then, so it holds nothing when the victim dies.
            victim = celery_workers(env, name=f"rb{number}victim", **QUICK)
            run = start_run(echo("first"), sleep_tool("long", 60))
            wait_until(
                lambda run_id=run.id: JournalEvent.objects.filter(
                    run_id=run_id, kind="step_started", step_id="long"
                ).exists(),
                timeout=30,
                what="the long step to start",
            )
            time.sleep(TTL / 2)  # a heartbeat and a sweep or two: where it is a countdown, the victim holds it
            survivor = celery_workers(env, name=f"rb{number}survivor", **QUICK)
            workers = [victim, survivor]
            killed = time.time()
            victim.kill()
            resumed = wait_until(
                lambda run_id=run.id: JournalEvent.objects.filter(
                    run_id=run_id, kind="step_started", step_id="long", payload__resumed=True
                ).first(),
                timeout=6 * TTL,
                what="the run to resume on the other worker",
            )
            figures.append(round(resumed.created_at.timestamp() - killed, 2))
            run_cancel(run_id=run.id, by="test", reason="measured")
            for worker in workers:
                worker.kill()
    finally:
        stop_beat(beat)
    print(f"resumed after the kill (s), TTL {TTL}: {figures}")
    assert len(figures) == 3  # each resumed, with no regular sweep and no countdown to do it

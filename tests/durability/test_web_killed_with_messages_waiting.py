"""The web process is killed (SIGKILL) after it answered new runs whose drive messages its DriveSender had not sent
yet (runs.dispatch): every run it answered 201 is made, and runs exactly once.

A real uvicorn and real workers share a private Redis of this test's (tests/support/servers.py). The Redis is
frozen with SIGSTOP, so the sender's first send blocks on it and the messages of the next runs wait in the web
process's memory; then the web process is killed, and the Redis thawed. What the design says of a lost message
holds: the run, its journal's first row and its lease booking were committed before the answer, the booking
expires, and the sweep re-drives the run."""

import os
import signal

import httpx
import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from tests.api.conftest import make_user, token_for
from tests.helpers import (
    QUICK,
    assert_gap_free,
    describe,
    echo_step,
    make_workflow,
    queue_length,
    sweep_until_end,
    wait_until,
)
from tests.support import workers as worker_support
from tests.support.servers import start_redis
from tests.support.web import uvicorn_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_runs_answered_before_the_web_process_was_killed_with_their_messages_waiting_each_run_once(
    transactional_db, tmp_path, celery_workers
):
    redis = start_redis(tmp_path)
    env = {"CELERY_BROKER_URL": redis.url, "PAL_LEASE_TTL": "2"}
    make_workflow(name="kept", steps=[echo_step("only", said="{{ input.n }}")])
    headers = {"Authorization": f"Bearer {token_for(make_user('otto', 'runs.view_run', 'runs.operate'))}"}
    try:
        with uvicorn_server(database_url=worker_support.database_url(), env=env, log_dir=tmp_path / "web") as web:
            api = f"{web}/api/v1"
            first = httpx.post(f"{api}/runs", json={"workflow": "kept", "input": {"n": 0}}, headers=headers, timeout=30)
            assert first.status_code == 201, first.text
            # The sender is up and sends to this Redis.
            wait_until(lambda: queue_length(redis) == 1, timeout=30, what="the first run's message on the broker")
            os.kill(redis.proc.pid, signal.SIGSTOP)
            try:
                answers = [
                    httpx.post(f"{api}/runs", json={"workflow": "kept", "input": {"n": n}}, headers=headers, timeout=30)
                    for n in range(1, 6)
                ]
                assert [a.status_code for a in answers] == [201] * 5, [a.text for a in answers]
                os.killpg(web.pid, signal.SIGKILL)  # the messages still waiting in it go with it
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
        made = [first.json()["id"], *(a.json()["id"] for a in answers)]

        # One worker takes what reached the private Redis; the sweep (this process's, as the beat's) sends its
        # re-drives to the shared test broker, where the other one listens.
        celery_workers({"CELERY_BROKER_URL": redis.url, "PAL_LEASE_TTL": "2"}, name="private", **QUICK)
        celery_workers({"PAL_LEASE_TTL": "2"}, name="shared", **QUICK)
        redriven = 0
        for n, run_id in enumerate(made):
            run = sweep_until_end(Run.objects.get(id=run_id))
            assert run.status == RunStatus.SUCCEEDED, describe(run)
            assert run.output == {"said": n}
            assert JournalEvent.objects.filter(run_id=run_id, kind="step_completed").count() == 1
            assert_gap_free(run)
            redriven += JournalEvent.objects.filter(run_id=run_id, kind="run_redriven", payload__by="sweep").count()
        # The sender was blocked on the frozen Redis with run 1's message (and run 2's too, when its thread came
        # to them only after the second answer, on a loaded machine: one pipeline takes all that waits), so the
        # messages of the later runs waited in the killed process and were lost: the sweep sent those runs again
        # once their bookings expired.
        assert redriven >= 3, redriven
    finally:
        redis.stop()

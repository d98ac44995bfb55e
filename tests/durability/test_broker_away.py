"""The broker goes away between a commit and its send: the web app's answer tells what was committed, and the run
is not lost. On Redis and on RabbitMQ.

A real uvicorn serves pal.asgi against the test database with a private broker of its own, a Redis
(tests/support/servers.py) or a RabbitMQ (tests/support/rabbitmq.py), which the test stops after a first run went
through it. Every task is sent after its
transaction commits, so by the time a send fails the run, its journal's first row and its lease booking are in: an
error answer there would tell the client the run was not made (a retry makes a second one). The runs are then
recovered the way the design says a lost message is: their bookings expire and the sweep re-drives them, here to
a real worker on the shared test broker.
"""

import httpx
import pytest

from journal.models import JournalEvent
from runs.models import Run, RunLock, RunStatus
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
from tests.support.rabbitmq import start_rabbitmq
from tests.support.servers import start_redis
from tests.support.web import uvicorn_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["redis", "rabbitmq"])
def web_on_its_own_broker(request, transactional_db, tmp_path):
    """(api base URL, the private broker it sends to, its log path)."""
    broker = (start_redis if request.param == "redis" else start_rabbitmq)(tmp_path)
    env = {"CELERY_BROKER_URL": broker.url, "PAL_LEASE_TTL": "2"}
    try:
        with uvicorn_server(database_url=worker_support.database_url(), env=env, log_dir=tmp_path / "web") as server:
            yield f"{server}/api/v1", broker, tmp_path / "web" / "uvicorn.log"
    finally:
        broker.stop()


def test_runs_created_while_the_broker_is_away_are_answered_as_made_and_later_run_once(
    web_on_its_own_broker, celery_workers
):
    api, broker, log = web_on_its_own_broker
    make_workflow(name="away", steps=[echo_step("only", said="{{ input.n }}")])
    headers = {"Authorization": f"Bearer {token_for(make_user('otto', 'runs.view_run', 'runs.operate'))}"}

    first = httpx.post(f"{api}/runs", json={"workflow": "away", "input": {"n": 0}}, headers=headers, timeout=30)
    assert first.status_code == 201, first.text
    # The web app's broker connection is up and used (its drive sender sends just after the answer).
    wait_until(lambda: queue_length(broker) == 1, timeout=30, what="the first run's message on the broker")
    broker.stop()

    one = httpx.post(f"{api}/runs", json={"workflow": "away", "input": {"n": 1}}, headers=headers, timeout=30)
    batch = httpx.post(
        f"{api}/runs/batch",
        json={"runs": [{"workflow": "away", "input": {"n": n}} for n in (2, 3, 4)]},
        headers=headers,
        timeout=30,
    )

    assert one.status_code == 201, one.text
    assert batch.status_code == 201, batch.text
    made = [one.json()["id"], *[item["id"] for item in batch.json()["items"]]]
    for run_id in made:
        run = Run.objects.get(id=run_id)
        assert run.status == RunStatus.QUEUED
        assert RunLock.objects.get(run_id=run_id).owner.startswith("task:")  # booked: the sweep's to re-drive
        assert [e.kind for e in JournalEvent.objects.filter(run_id=run_id)] == ["run_created"]
    # Logged by the web process's drive sender once its send fails (after the answers: it sends behind them).
    lines = (f"run {made[0]}: drive task not sent", f"runs {', '.join(made[1:])}: drive tasks (some or all) not sent")
    wait_until(
        lambda: all(line in log.read_text() for line in lines), timeout=30, what="the lines", explain=log.read_text
    )
    assert "the sweep sends it again once its booking expires" in log.read_text()

    celery_workers(name="after", **QUICK)
    for n, run_id in enumerate(made, start=1):
        run = sweep_until_end(Run.objects.get(id=run_id))
        assert run.status == RunStatus.SUCCEEDED, describe(run)
        assert run.output == {"said": n}
        redriven = [e.payload["by"] for e in JournalEvent.objects.filter(run_id=run_id, kind="run_redriven")]
        # Re-driven by the sweep (twice when the one worker reached it only after its new booking's 2 s had run
        # out, on a loaded machine), and run once all the same.
        assert redriven and set(redriven) == {"sweep"}, redriven
        assert JournalEvent.objects.filter(run_id=run_id, kind="step_completed").count() == 1
        assert_gap_free(run)


def test_an_operators_redrive_while_the_broker_is_away_is_accepted_and_the_run_goes_on(
    web_on_its_own_broker, celery_workers
):
    api, broker, _log = web_on_its_own_broker
    make_workflow(name="away", steps=[echo_step("only", said="kept")])
    headers = {"Authorization": f"Bearer {token_for(make_user('otto', 'runs.view_run', 'runs.operate'))}"}
    created = httpx.post(f"{api}/runs", json={"workflow": "away"}, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    broker.stop()  # the message of its creation is lost with it: no worker listens on that broker

    answer = httpx.post(
        f"{api}/runs/{run_id}/redrive", json={"reason": "stuck", "force": True}, headers=headers, timeout=30
    )

    assert answer.status_code == 202, answer.text
    by_operator = JournalEvent.objects.get(run_id=run_id, kind="run_redriven")
    assert by_operator.payload["by"] != "sweep"
    celery_workers(name="after", **QUICK)
    run = sweep_until_end(Run.objects.get(id=run_id))
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"said": "kept"}
    assert JournalEvent.objects.filter(run_id=run_id, kind="step_completed").count() == 1
    assert_gap_free(run)

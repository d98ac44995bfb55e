"""A cancelled run calls out no more (issue 23, section 3): a model call or a webhook that the peer answered 503,
cancelled while its transport retries wait (a Retry-After sleep, a back-off), reaches the peer no more. Before each
try and after each sleep the step reads its lease in the database: the heartbeat's flag alone lags a cancel by up to
a heartbeat (10 s here), and a sleep of up to 30 s went on to its end.

A real worker, Postgres and Redis, the local provider and receiver counting every request that reaches them."""

import time

import pytest

from runs.models import RunStatus
from runs.services import run_cancel
from tests.helpers import QUICK, describe, llm, start_run, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# A lease that lives long and a heartbeat that comes rarely: only the database can tell the walk of the cancel soon.
SLOW_HEARTBEAT = {"PAL_LEASE_TTL": "30", "PAL_HEARTBEAT_INTERVAL": "10", "PAL_SLICE_SECONDS": "120"}
RETRY_AFTER = 20  # seconds the provider's 503 asks for: the walk must not sleep them out


def _cancel_and_wait_for_the_walk_to_stop(run, worker) -> float:
    cancelled = time.monotonic()
    run_cancel(run_id=run.id, by="ops", reason="stop calling out")
    worker.wait_for_log(rf"run {run.id}: .*stopping without writing", timeout=60)
    return time.monotonic() - cancelled


def test_a_model_call_cancelled_during_a_retry_after_sleep_is_not_sent_again(celery_workers, llm_provider):
    llm_provider.retry_after = str(RETRY_AFTER)
    llm_provider.fail_next(3, status=503)  # the first try and the transport retries all get 503 + Retry-After
    worker = celery_workers({**llm_provider.env(), **SLOW_HEARTBEAT}, name="cancel-llm", **QUICK)
    run = start_run(llm("draft", "Write it"))
    llm_provider.wait_for_calls(1, timeout=30)

    stopped = _cancel_and_wait_for_the_walk_to_stop(run, worker)

    print(f"the walk stopped {stopped:.2f}s after the cancel, inside a {RETRY_AFTER}s Retry-After sleep")
    assert stopped < RETRY_AFTER, "the Retry-After sleep went on to its end"
    time.sleep(1.0)  # a try that would follow the sleep comes within its back-off (0.2 s)
    assert len(llm_provider.calls) == 1, [(c.outcome, c.idempotency_key) for c in llm_provider.calls]
    assert llm_provider.total_billed == 0
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, describe(run)


def test_a_webhook_cancelled_while_the_receiver_answers_503_is_not_sent_again(celery_workers, webhook_receiver):
    webhook_receiver.fail_next(4, status=503)
    webhook_receiver.delay = 3.0  # the cancel lands while the first try waits for its 503
    worker = celery_workers({**webhook_receiver.env(), **SLOW_HEARTBEAT}, name="cancel-hook", **QUICK)
    run = start_run(webhook("notify", webhook_receiver.url, {"n": 1}))
    webhook_receiver.wait_for_requests(1, timeout=30)

    stopped = _cancel_and_wait_for_the_walk_to_stop(run, worker)

    print(f"the walk stopped {stopped:.2f}s after the cancel (the receiver held its 503 for 3 s)")
    time.sleep(1.0)
    assert len(webhook_receiver.requests) == 1, [r.outcome for r in webhook_receiver.requests]
    assert webhook_receiver.deliveries == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, describe(run)

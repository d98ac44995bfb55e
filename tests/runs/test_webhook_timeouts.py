"""A webhook's timeout_seconds (issue 10 section 7): a POST that timed out, or a deadline spent after a send, is an
unknown outcome (the receiver may have it), retried under the same Idempotency-Key; never a permanent failure.
Only a deadline spent before anything was sent is a definite step_timeout."""

import time

import pytest

from runs.errors import StepError
from runs.models import RunStatus, SideEffect
from runs.steps.base import StepContext
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import drive_to_end, make_run, step_events
from tests.support.peers import WebhookReceiver

pytestmark = pytest.mark.django_db


class SlowReceiver(WebhookReceiver):
    """Takes each of its first `slow` requests (accepted on arrival, like a real receiver) and answers it only
    after `seconds`, long past the sender's HTTP timeout; answers at once after that."""

    def __init__(self, *, slow: int, seconds: float, **kwargs):
        super().__init__(**kwargs)
        self.slow, self.seconds = slow, seconds

    def _sleep_delay(self):
        with self._lock:
            number = len(self.requests)
        if number <= self.slow:
            self._stopping.wait(self.seconds)


@pytest.fixture
def slow_receiver(settings):
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.PAL_UNKNOWN_RETRIES = 5
    with SlowReceiver(slow=2, seconds=1.5, secret=WEBHOOK_SECRET) as receiver:
        yield receiver


def hook(url: str, **extra) -> dict:
    return {"id": "hook", "kind": "deliver", "channel": "webhook", "url": url, "body": {"a": 1}, **extra}


def assert_retried_under_one_key(run, receiver, *, code: str):
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert step_events(run, "step_failed") == []
    retrying = step_events(run, "step_retrying", "hook")
    assert len(retrying) >= 2
    assert all(e.attempt == 1 and e.payload["permanent"] is False for e in retrying)
    assert retrying[0].payload["code"] == code
    key = f"{run.id}:hook:1"
    assert [r.idempotency_key for r in receiver.requests] == [key] * len(receiver.requests)
    assert len(receiver.requests) >= 3  # two that timed out, then the one answered
    assert all(r.signature_valid for r in receiver.requests)
    effect = SideEffect.objects.get(run=run)
    assert (effect.key, effect.status) == (key, "delivered")


def test_a_post_that_times_out_is_an_unknown_outcome_sent_again_under_the_same_key(slow_receiver, settings):
    settings.PAL_TRANSPORT_RETRIES = 0  # each run of the attempt makes one POST, cut off by the HTTP timeout
    run = make_run(steps=[hook(slow_receiver.url, timeout_seconds=0.4, retry={"max_attempts": 3})])

    drive_to_end(run)

    assert_retried_under_one_key(run, slow_receiver, code="webhook_unavailable")


def test_a_deadline_spent_after_a_send_is_an_unknown_outcome_not_a_step_timeout(slow_receiver, settings):
    # The first POST uses up the step's whole timeout_seconds; the transport retry after it finds the deadline
    # gone. Before, that was a permanent step_timeout although the receiver had the delivery.
    settings.PAL_TRANSPORT_RETRIES = 1
    run = make_run(steps=[hook(slow_receiver.url, timeout_seconds=0.4, retry={"max_attempts": 3})])

    drive_to_end(run)

    assert_retried_under_one_key(run, slow_receiver, code="step_timeout_unknown")


def test_a_deadline_spent_before_anything_was_sent_is_a_definite_step_timeout(webhook_receiver, settings):
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    run = make_run(steps=[hook(webhook_receiver.url, timeout_seconds=1e-6)])  # spent by the claim itself

    drive_to_end(run)

    assert run.status == RunStatus.FAILED
    assert (run.error["code"], run.error["permanent"]) == ("step_timeout", True)
    assert webhook_receiver.requests == []
    effect = SideEffect.objects.get(run=run)
    assert effect.status == "failed"  # closed as never sent, so a retry's new key sends it honestly
    assert effect.response["reason"].startswith("never sent")


def context(*, sent: bool) -> StepContext:
    return StepContext(
        run_id="r",
        step_id="hook",
        attempt=1,
        key="r:hook:1",
        resumed=False,
        timeout=0.5,
        emit=lambda kind, payload=None: 0,
        lease_lost=lambda: False,
        claim=None,
        confirm=None,
        deadline=time.monotonic() - 1,
        sent=sent,
    )


@pytest.mark.parametrize(
    "sent, permanent, code", [(False, True, "step_timeout"), (True, False, "step_timeout_unknown")]
)
def test_a_spent_deadline_is_definite_only_while_nothing_was_sent(sent, permanent, code):
    with pytest.raises(StepError) as stopped:
        context(sent=sent).check_lease()

    assert (stopped.value.permanent, stopped.value.code) == (permanent, code)

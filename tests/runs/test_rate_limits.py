"""PAL_RATE_LIMITS (issue 14): calls of a limit start at most requests_per_minute in any 60-second window, and none
while the last 60 s reported tokens_per_minute tokens; a call over the limit waits durably (the run parks with a
wake time, holding no worker) and `why` names the limit and when the next slot opens."""

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from pal.settings import _rate_limits
from runs.explain import run_why
from runs.models import RateSlot, Run, RunLock, RunStatus
from runs.rate_limits import SEND_MARGIN, WINDOW
from runs.services import run_wake_timer
from tests.helpers import drive_to_end, make_run, step_events

pytestmark = pytest.mark.django_db


def fan_of_calls(n: int, model: str = "gpt-4o-mini", at_once: int = 10):
    step = {"id": "ask", "kind": "llm_call", "provider": "fake", "model": model, "prompt": "Q {{ item }}"}
    fan = {**step, "for_each": "{{ input.qs }}", "max_concurrency": at_once}
    return make_run(steps=[fan], input={"qs": list(range(n))})


def a_minute_passes(run):
    """Move the clock: the window's calls are a minute (and the send margin) old, and the run's wake time has come."""
    RateSlot.objects.update(started_at=timezone.now() - WINDOW - SEND_MARGIN - timedelta(seconds=1))
    Run.objects.filter(id=run.id).update(wake_at=timezone.now() - timedelta(seconds=1))
    assert run_wake_timer(run_id=run.id)


def test_calls_over_requests_per_minute_wait_durably_and_go_on_when_the_window_moves(settings):
    settings.PAL_RATE_LIMITS = {"llm:gpt-4o-mini": {"requests_per_minute": 2}}
    run = fan_of_calls(5)
    waves = []
    for _ in range(5):
        drive_to_end(run)
        waves.append(len(step_events(run, "step_completed")))
        if run.status == RunStatus.SUCCEEDED:
            break
        assert run.status == RunStatus.WAITING and not RunLock.objects.filter(run_id=run.id).exists()
        assert run.waiting_on["kind"] == "rate_limit" and run.wake_at is not None
        assert "rate limit llm:gpt-4o-mini (requests_per_minute 2" in run_why(run)
        assert RateSlot.objects.filter(started_at__gt=timezone.now() - timedelta(seconds=60)).count() <= 2
        a_minute_passes(run)

    assert run.status == RunStatus.SUCCEEDED
    assert waves == [2, 4, 6]  # two items a window; the last window also completes the step
    assert len(run.output) == 5


def test_tokens_per_minute_count_what_the_calls_reported_and_other_models_are_not_held(settings):
    settings.PAL_RATE_LIMITS = {"llm:gpt-4o-mini": {"tokens_per_minute": 1}}
    held = fan_of_calls(2, at_once=1)  # calls that start together all start: the count is of what they reported
    drive_to_end(held)
    assert held.status == RunStatus.WAITING and held.waiting_on.get("tokens_per_minute") == 1
    assert RateSlot.objects.get().tokens > 0  # the first call's reported usage

    free = fan_of_calls(3, model="other-model")
    drive_to_end(free)
    assert free.status == RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    "bad, says",
    [
        ([], "must be a JSON object"),
        ({"sms:x": {"requests_per_minute": 1}}, "'sms:x' is not llm:MODEL"),
        ({"email:ops": {"requests_per_minute": 1}}, "'email:ops' is not"),
        ({"llm:*": {"per_hour": 1}}, "requests_per_minute and/or tokens_per_minute"),
        ({"llm:*": {"requests_per_minute": 0}}, "'llm:*'.requests_per_minute must be a whole number above 0"),
    ],
)
def test_a_bad_rate_limit_setting_stops_start_up_naming_what_is_wrong(bad, says):
    with pytest.raises(ImproperlyConfigured, match="PAL_RATE_LIMITS") as refused:
        _rate_limits(bad)
    assert says in str(refused.value)

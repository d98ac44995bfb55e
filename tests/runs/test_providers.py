"""The outside world answering badly, against real local peers: the step fails clearly (definite errors) or
tries again under the same key (unknown outcomes), and nothing is half-written."""

import pytest

from journal.models import JournalEvent
from runs.models import RunStatus, SideEffect
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import SMTP_MAIL, drive_to_end, mailer, make_run, step_events
from tests.support.peers import LLMProvider

pytestmark = pytest.mark.django_db

LLM = {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Summarise: {{ input.ticket }}"}


@pytest.fixture
def provider(settings):
    with LLMProvider(api_key="sk-test-secret-123") as peer:
        settings.PAL_LLM_BASE_URL = peer.url
        settings.PAL_LLM_API_KEY = "sk-test-secret-123"
        settings.PAL_UNKNOWN_RETRIES = 0
        yield peer


def test_a_call_carries_the_attempt_key_and_the_bearer_key_and_reports_usage_and_cost(provider, settings):
    run = make_run(steps=[LLM], input={"ticket": "printer on fire"})
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    call = provider.calls[0]
    assert call.idempotency_key == f"{run.id}:draft:1"
    assert call.headers["Authorization"] == "Bearer sk-test-secret-123"
    assert call.json["messages"] == [{"role": "user", "content": "Summarise: printer on fire"}]
    usage = run.output["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    prompt_price, completion_price = settings.PAL_LLM_PRICES["gpt-4o-mini"]
    expected = round((usage["prompt_tokens"] * prompt_price + usage["completion_tokens"] * completion_price) / 1000, 8)
    assert run.output["cost_usd"] == expected


def test_the_provider_key_never_reaches_the_journal(provider):
    run = make_run(steps=[LLM], input={"ticket": "x"})
    drive_to_end(run)
    for event in JournalEvent.objects.filter(run_id=run.id):
        assert "sk-test-secret-123" not in str(event.payload)


def test_an_answer_that_is_not_json_fails_the_step_clearly(provider):
    provider.garbage_next(1)
    run = make_run(steps=[LLM], input={"ticket": "x"})
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "provider_garbage"
    assert "not a chat completion" in run.error["message"]
    assert step_events(run, "step_completed") == []


def test_a_4xx_is_definite_fails_at_once_and_is_not_retried(provider):
    provider.fail_next(1, status=400)
    run = make_run(steps=[LLM], input={"ticket": "x"})
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "provider_refused"
    assert "HTTP 400" in run.error["message"]
    assert len(provider.calls) == 1


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_a_retryable_status_is_retried_inside_the_attempt_with_the_same_key(provider, status):
    provider.fail_next(2, status=status)
    run = make_run(steps=[LLM], input={"ticket": "x"})
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    keys = [c.idempotency_key for c in provider.calls]
    assert keys == [f"{run.id}:draft:1"] * 3
    assert provider.billed == {f"{run.id}:draft:1": 1}
    assert [e.attempt for e in step_events(run, "step_started")] == [1]


def test_a_provider_down_for_good_ends_in_a_step_failed_naming_the_key(settings):
    settings.PAL_LLM_BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    settings.PAL_UNKNOWN_RETRIES = 0
    settings.PAL_TRANSPORT_RETRIES = 1
    run = make_run(steps=[LLM], input={"ticket": "x"})
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "provider_unavailable"
    assert f"{run.id}:draft:1" in run.error["message"]


def test_a_webhook_refused_with_4xx_fails_the_step_and_marks_the_side_effect(webhook_receiver, settings):
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    webhook_receiver.fail_next(1, status=422)
    run = make_run(
        steps=[{"id": "hook", "kind": "deliver", "channel": "webhook", "url": webhook_receiver.url, "body": {"a": 1}}]
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "webhook_refused"
    effect = SideEffect.objects.get(run=run)
    assert (effect.status, effect.key) == ("failed", f"{run.id}:hook:1")


def test_a_webhook_is_signed_with_the_secret_and_the_secret_is_not_journaled(webhook_receiver, settings):
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    run = make_run(
        steps=[
            {
                "id": "hook",
                "kind": "deliver",
                "channel": "webhook",
                "url": webhook_receiver.url,
                "body": {"summary": "{{ input.s }}"},
            }
        ],
        input={"s": "ok"},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    delivery = webhook_receiver.deliveries[0]
    assert delivery.signature_valid is True
    assert delivery.json == {"summary": "ok"}
    assert webhook_receiver.dedup == {f"{run.id}:hook:1": 1}
    for event in JournalEvent.objects.filter(run_id=run.id):
        assert WEBHOOK_SECRET not in str(event.payload)


def test_an_email_goes_through_smtp_with_a_message_id_derived_from_the_key(smtp_sink, settings):
    from runs.steps.deliver import message_id_for

    settings.MAILERS = mailer(SMTP_MAIL, host=smtp_sink.host, port=smtp_sink.port)
    run = make_run(
        steps=[
            {
                "id": "mail",
                "kind": "deliver",
                "channel": "email",
                "to": ["ops@example.com"],
                "subject": "Ticket {{ input.id }}",
                "body": "hello",
            }
        ],
        input={"id": 7},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    smtp_sink.wait_for_messages(1)
    assert smtp_sink.message_ids == [message_id_for(f"{run.id}:mail:1")]
    assert SideEffect.objects.get(run=run).status == "delivered"

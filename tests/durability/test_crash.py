"""kill -9 in the middle of a step: the run is neither lost nor repeats a paid call or an email.

Each test starts a real worker, waits until it is inside a step at a known point, SIGKILLs its whole
process group (no shutdown code runs, the Celery message stays unacked in Redis), starts a fresh worker and
plays the beat scheduler with sweep_once() until the run has ended.
"""

import pytest

from runs.models import RunStatus, SideEffect, SideEffectStatus
from runs.steps.deliver import message_id_for
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import (
    QUICK,
    assert_gap_free,
    calls_with_key,
    describe,
    echo,
    email,
    events,
    hold_calls_containing,
    key,
    llm,
    sleep_tool,
    start_run,
    sweep_until_end,
    wait_for_event,
    wait_until,
    webhook,
)
from tests.support.peers import sign

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_worker_killed_during_an_llm_call_is_recovered_and_each_step_is_billed_once(celery_workers, llm_provider):
    hold_calls_containing(llm_provider, "DRAFT", seconds=60)
    first = celery_workers(llm_provider.env(), name="llm-a", **QUICK)
    run = start_run(
        llm("outline", "OUTLINE ticket {{ input.ticket }}"),
        llm("draft", "DRAFT a reply from {{ steps.outline.output.text }}"),
        input={"ticket": "printer on fire"},
    )
    outline_key, draft_key = key(run, "outline"), key(run, "draft")

    wait_until(
        lambda: calls_with_key(llm_provider, draft_key),
        timeout=30,
        what="the draft call to reach the provider",
        explain=lambda: describe(run),
    )
    first.kill()
    llm_provider.delay = 0
    celery_workers(llm_provider.env(), name="llm-b", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output["text"] == "Reply to: DRAFT a reply from Reply to: OUTLINE ticket printer on fire"
    # The provider billed every key once; the interrupted call was sent again with the same key and replayed.
    assert llm_provider.billed == {outline_key: 1, draft_key: 1}
    assert [c.outcome for c in calls_with_key(llm_provider, draft_key)] == ["billed", "replayed"]
    # The step completed before the crash was reused from the journal, not called again.
    assert len(calls_with_key(llm_provider, outline_key)) == 1
    assert len(events(run, "step_started", "outline")) == 1
    # The journal tells the story: the sweep re-drove the run, and the same attempt was resumed.
    redriven = events(run, "run_redriven")
    assert redriven and all(e.payload["by"] == "sweep" for e in redriven), describe(run)
    assert redriven[0].payload["previous_lease"]["owner"].startswith("llm-a:"), describe(run)
    started = events(run, "step_started", "draft")
    assert [(e.attempt, e.payload.get("resumed", False)) for e in started] == [(1, False), (1, True)], describe(run)
    assert started[0].seq < redriven[0].seq < started[1].seq
    assert [e.attempt for e in events(run, "step_completed", "draft")] == [1]
    assert_gap_free(run)


def test_a_webhook_interrupted_after_its_claim_is_sent_again_with_the_same_key(celery_workers, webhook_receiver):
    webhook_receiver.delay = 60
    first = celery_workers(webhook_receiver.env(), name="hook-a", **QUICK)
    run = start_run(
        echo("prepare", summary="disk full"),
        webhook("notify", webhook_receiver.url, {"summary": "{{ steps.prepare.output.summary }}"}),
    )
    notify_key = key(run, "notify")

    assert webhook_receiver.request_started.wait(30), describe(run)
    # The claim was journaled and committed before the request left.
    claimed = events(run, "side_effect_claimed", "notify")
    assert [e.payload["key"] for e in claimed] == [notify_key], describe(run)
    first.kill()
    webhook_receiver.delay = 0
    celery_workers(webhook_receiver.env(), name="hook-b", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"channel": "webhook", "key": notify_key, "status": "delivered"}
    # Sent twice (the receiver cannot know the first one's sender died), always under the one key.
    assert webhook_receiver.dedup == {notify_key: 2}
    body = b'{"summary":"disk full"}'
    assert [d.body for d in webhook_receiver.deliveries] == [body, body]
    assert [d.signature_valid for d in webhook_receiver.deliveries] == [True, True]
    assert webhook_receiver.deliveries[-1].headers["X-PAL-Signature"] == sign(WEBHOOK_SECRET, body)
    # One claim, one confirmation: the re-drive found the claim and did not take a second one.
    effect = SideEffect.objects.get(run_id=run.id)
    assert (effect.key, effect.status) == (notify_key, SideEffectStatus.DELIVERED)
    assert len(events(run, "side_effect_claimed", "notify")) == 1
    assert len(events(run, "side_effect_delivered", "notify")) == 1
    assert [e.payload.get("resumed", False) for e in events(run, "step_started", "notify")] == [False, True]
    assert_gap_free(run)


def test_a_worker_killed_inside_a_tool_step_resumes_it_without_repeating_earlier_steps_or_mailing_twice(
    celery_workers, llm_provider, smtp_sink
):
    env = {**llm_provider.env(), **smtp_sink.env()}
    first = celery_workers(env, name="tool-a", **QUICK)
    run = start_run(
        llm("draft", "DRAFT a status update"),
        sleep_tool("wait", 5),
        email("mail", "ops@example.com", "Status", "{{ steps.draft.output.text }}"),
    )

    wait_for_event(run, "step_started", "wait")
    first.kill()
    celery_workers(env, name="tool-b", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    # The LLM step completed before the crash: billed and called once, started once.
    assert llm_provider.billed == {key(run, "draft"): 1}
    assert len(llm_provider.calls) == 1
    assert len(events(run, "step_started", "draft")) == 1
    # The interrupted tool step ran again in the same attempt and completed once.
    assert [(e.attempt, e.payload.get("resumed", False)) for e in events(run, "step_started", "wait")] == [
        (1, False),
        (1, True),
    ], describe(run)
    assert [e.payload["output"] for e in events(run, "step_completed", "wait")] == [{"slept": 5}]
    # The email after it went out exactly once, with the Message-ID derived from its key.
    smtp_sink.wait_for_messages(1)
    assert smtp_sink.message_ids == [message_id_for(key(run, "mail"))]
    (message,) = smtp_sink.messages
    assert message.get_content().strip() == "Reply to: DRAFT a status update"
    assert run.output == {"channel": "email", "key": key(run, "mail"), "status": "delivered"}
    assert_gap_free(run)


def test_an_email_claimed_before_a_crash_is_not_sent_again_but_marked_unconfirmed(celery_workers, smtp_sink):
    smtp_sink.delay = 10  # the worker is inside the SMTP conversation (DATA sent, no answer) when killed
    first = celery_workers(smtp_sink.env(), name="mail-a", **QUICK)
    run = start_run(
        email("mail", "ops@example.com", "Incident {{ input.id }}", "The disk is full"),
        echo("after", done=True),
        input={"id": 7},
    )
    mail_key = key(run, "mail")

    assert smtp_sink.request_started.wait(30), describe(run)
    assert SideEffect.objects.get(run_id=run.id).status == SideEffectStatus.CLAIMED
    first.kill()
    smtp_sink.request_started.clear()  # from here on, any DATA the sink sees is a second send
    celery_workers(smtp_sink.env(), name="mail-b", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"done": True}
    # The re-drive did not start a second SMTP delivery; the sink holds at most the one from before the crash
    # (this sink drops a message whose client died during DATA; a real server might have delivered it).
    assert not smtp_sink.request_started.is_set(), "the mail server received the message a second time"
    assert smtp_sink.message_ids.count(message_id_for(mail_key)) <= 1
    assert len(smtp_sink.mails) <= 1
    # An operator must decide: the side effect says it may or may not have gone out.
    effect = SideEffect.objects.get(run_id=run.id)
    assert (effect.key, effect.status) == (mail_key, SideEffectStatus.UNCONFIRMED)
    assert [e.payload["output"] for e in events(run, "step_completed", "mail")] == [
        {"channel": "email", "key": mail_key, "status": "unconfirmed"}
    ]
    assert [e.payload.get("resumed", False) for e in events(run, "step_started", "mail")] == [False, True]
    assert len(events(run, "side_effect_claimed", "mail")) == 1
    assert len(events(run, "side_effect_unconfirmed", "mail")) == 1
    assert events(run, "side_effect_delivered") == []
    assert_gap_free(run)

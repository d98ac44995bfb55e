"""An operator's decision on a claimed-but-unconfirmed side effect (runs.services.side_effect_resolve): mark it
delivered, or send it again with the same key; journaled with who and why, and never sent twice by two clicks."""

from datetime import timedelta

import pytest
from django.utils import timezone

from journal.receipts import receipt_build
from journal.services import NewEvent
from runs.models import Run, RunLock, RunStatus, SideEffect, SideEffectStatus
from runs.services import Conflict, NotFound, ServiceError, side_effect_resolve
from runs.steps.deliver import message_id_for
from tests.helpers import (
    CRASHING_MAIL,
    LOCMEM_MAIL,
    Crash,
    drive,
    drive_to_end,
    echo_step,
    expire_lease,
    journal_by_hand,
    mailer,
    make_run,
    step_events,
    sweep_after_expiry,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def locmem_email(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)


def email_step(step_id="mail"):
    return {
        "id": step_id,
        "kind": "deliver",
        "channel": "email",
        "to": ["ops@example.com"],
        "subject": "Ticket {{ input.id }}",
        "body": "Hello {{ steps.greet.output.who }}",
    }


def unconfirmed_email(settings) -> tuple[Run, SideEffect]:
    """The worker died while talking to the mail server; the re-drive marked the email unconfirmed and the run
    went on to succeed without sending it again."""
    run = make_run(steps=[echo_step("greet", who="Ada"), email_step(), echo_step("after")], input={"id": 7})
    settings.MAILERS = mailer(CRASHING_MAIL)
    with pytest.raises(Crash):
        drive(run)
    settings.MAILERS = mailer(LOCMEM_MAIL)
    sweep_after_expiry(run)
    drive_to_end(run)
    effect = SideEffect.objects.get(key=f"{run.id}:mail:1")
    assert (run.status, effect.status) == (RunStatus.SUCCEEDED, SideEffectStatus.UNCONFIRMED)
    return run, effect


def webhook_claimed_before_a_crash(url: str) -> tuple[Run, SideEffect]:
    """The worker claimed the webhook's key, may or may not have sent it, and died; its lease has expired."""
    run = make_run(steps=[{"id": "hook", "kind": "deliver", "channel": "webhook", "url": url, "body": {"a": 1}}])
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    key = f"{run.id}:hook:1"
    journal_by_hand(
        run,
        NewEvent("run_started"),
        NewEvent("step_started", "hook", 1, {"key": key, "kind": "deliver"}),
        NewEvent("side_effect_claimed", "hook", 1, {"key": key, "channel": "webhook", "target": url}),
    )
    effect = SideEffect.objects.create(
        key=key, run=run, step_id="hook", attempt=1, channel="webhook", target=url, claimed_at=timezone.now()
    )
    expire_lease(run)
    return run, effect


def test_marking_an_unconfirmed_email_delivered_sends_nothing_and_is_journaled(settings, mailoutbox):
    run, effect = unconfirmed_email(settings)
    side_effect_resolve(key=effect.key, decision="mark_delivered", by="olga", reason="customer confirmed by phone")
    effect.refresh_from_db()
    assert effect.status == SideEffectStatus.DELIVERED and effect.delivered_at is not None
    assert mailoutbox == []
    resolved = step_events(run, "side_effect_resolved", "mail")
    assert len(resolved) == 1
    assert resolved[0].attempt == 1
    assert resolved[0].payload == {
        "key": effect.key,
        "channel": "email",
        "decision": "mark_delivered",
        "by": "olga",
        "who": "olga",
        "why": "customer confirmed by phone",
        "previous_status": "unconfirmed",
        "status": "delivered",
    }
    receipt_effect = receipt_build(run_id=run.id)["steps"][1]["side_effects"][0]
    assert receipt_effect["status"] == "delivered"


def test_sending_an_unconfirmed_email_again_uses_the_same_message_id(settings, mailoutbox):
    run, effect = unconfirmed_email(settings)
    side_effect_resolve(key=effect.key, decision="send_again", by="olga", reason="not in the inbox")
    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert mail.extra_headers["Message-ID"] == message_id_for(effect.key)
    assert (mail.subject, mail.body, mail.to) == ("Ticket 7", "Hello Ada", ["ops@example.com"])
    effect.refresh_from_db()
    assert effect.status == SideEffectStatus.DELIVERED
    resolved = step_events(run, "side_effect_resolved", "mail")[0].payload
    assert (resolved["decision"], resolved["via"], resolved["status"], resolved["by"]) == (
        "send_again",
        "sent_now",
        "delivered",
        "olga",
    )


def test_a_claimed_webhook_of_a_stuck_run_is_sent_again_by_a_redrive_with_the_same_key(webhook_receiver):
    run, effect = webhook_claimed_before_a_crash(webhook_receiver.url)
    side_effect_resolve(key=effect.key, decision="send_again", by="olga", reason="receiver says nothing arrived")
    redriven = step_events(run, "run_redriven")
    assert len(redriven) == 1 and redriven[0].payload["by"] == "olga"
    assert "receiver says nothing arrived" in redriven[0].payload["why"]
    assert step_events(run, "side_effect_resolved")[0].payload["via"] == "redrive"
    assert SideEffect.objects.get(id=effect.id).status == SideEffectStatus.CLAIMED  # until the step confirms
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert webhook_receiver.dedup == {effect.key: 1}
    assert SideEffect.objects.get(id=effect.id).status == SideEffectStatus.DELIVERED


def test_a_claimed_webhook_of_an_ended_run_is_sent_now_with_the_same_key(webhook_receiver):
    run, effect = webhook_claimed_before_a_crash(webhook_receiver.url)
    from runs.services import run_cancel

    run_cancel(run_id=run.id, by="olga", reason="stop it")
    side_effect_resolve(key=effect.key, decision="send_again", by="olga", reason="it must still go out")
    assert webhook_receiver.dedup == {effect.key: 1}
    assert SideEffect.objects.get(id=effect.id).status == SideEffectStatus.DELIVERED
    assert step_events(run, "run_redriven") == []


def test_a_side_effect_a_live_lease_may_be_sending_right_now_is_left_alone(webhook_receiver):
    run, effect = webhook_claimed_before_a_crash(webhook_receiver.url)
    RunLock.objects.filter(run_id=run.id).update(expires_at=timezone.now() + timedelta(seconds=30))
    for decision in ("mark_delivered", "send_again"):
        with pytest.raises(Conflict) as refused:
            side_effect_resolve(key=effect.key, decision=decision, by="olga", reason="r")
        assert refused.value.code == "lease_held"
    assert webhook_receiver.deliveries == []
    assert step_events(run, "side_effect_resolved") == []


def test_a_settled_side_effect_has_nothing_to_decide(settings):
    _run, effect = unconfirmed_email(settings)
    side_effect_resolve(key=effect.key, decision="mark_delivered", by="olga", reason="ok")
    with pytest.raises(Conflict) as refused:
        side_effect_resolve(key=effect.key, decision="send_again", by="olga", reason="again")
    assert refused.value.code == "side_effect_settled"


def test_a_decision_needs_a_known_key_a_known_decision_and_a_reason(settings):
    _run, effect = unconfirmed_email(settings)
    with pytest.raises(ServiceError) as refused:
        side_effect_resolve(key=effect.key, decision="shrug", by="olga", reason="r")
    assert refused.value.code == "invalid_decision"
    with pytest.raises(ServiceError) as refused:
        side_effect_resolve(key=effect.key, decision="mark_delivered", by="olga", reason="  ")
    assert refused.value.code == "reason_required"
    with pytest.raises(NotFound):
        side_effect_resolve(key="nope:mail:1", decision="mark_delivered", by="olga", reason="r")


def test_two_decisions_at_once_let_one_through(settings, mailoutbox):
    """Operator B read the row before operator A's decision committed: B's send is refused, not sent twice."""
    from runs.services.side_effects import _side_effect_send_now

    run, effect = unconfirmed_email(settings)
    read_by_b = SideEffect.objects.select_related("run", "run__workflow").get(id=effect.id)
    side_effect_resolve(key=effect.key, decision="send_again", by="anna", reason="first")
    with pytest.raises(Conflict) as refused:
        _side_effect_send_now(read_by_b, resolved={"decision": "send_again"}, by="bert")
    assert refused.value.code == "side_effect_changed"
    assert len(mailoutbox) == 1
    assert [e.payload["by"] for e in step_events(run, "side_effect_resolved")] == ["anna"]

"""An approval's notify (issue 28): when the decision opens, an email and a signed webhook carrying the link that opens
it, each through the deliver step's claim under a key of its own, once per decision (a re-walk of the parked approval
sends nothing again; a crash mid-send leaves the email unconfirmed, never sent twice); the link decides once without a
login when link_decides (a second use: 410), and its token is never in the journal."""

import json
from datetime import timedelta

import pytest
from django.core import mail

from journal.models import JournalEvent
from pal.clock import db_now
from runs.decision_links import link_token
from runs.models import RunStatus, SideEffect
from runs.services import ServiceError, approval_decide_by_link, approval_link_open, signal_send
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import (
    CRASHING_MAIL,
    LOCMEM_MAIL,
    Crash,
    drive,
    drive_to_end,
    kinds,
    mailer,
    make_run,
    step_events,
    sweep_after_expiry,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def peers(settings, webhook_receiver):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.PAL_SITE_URL = "https://pal.example.com"
    return webhook_receiver


def notified(webhook_receiver, link_decides=True, *, extra_steps=()):
    notify = {"email": ["ops@example.com"], "webhook": webhook_receiver.url}
    step = {"id": "review", "kind": "approval", "prompt": "Refund 7?", "notify": notify, "link_decides": link_decides}
    run = make_run(steps=[{**step, "needs": []}, *extra_steps])
    drive(run)
    assert run.status == RunStatus.WAITING, kinds(run)
    return run


def token_of(webhook_receiver) -> str:
    (delivery,) = webhook_receiver.deliveries
    url = json.loads(delivery.body)["url"]
    assert url.startswith("https://pal.example.com/decisions/")
    return url.removeprefix("https://pal.example.com/decisions/").rstrip("/")


def test_an_email_and_a_signed_webhook_go_out_once_with_the_link(webhook_receiver):
    run = notified(webhook_receiver)

    (delivery,) = webhook_receiver.deliveries
    body = json.loads(delivery.body)
    assert delivery.signature_valid is True
    assert delivery.idempotency_key == f"{run.id}:review:1:notify-webhook"
    assert (body["event"], body["step_id"], body["attempt"], body["link_decides"]) == (
        "decision_opened",
        "review",
        1,
        True,
    )
    (message,) = mail.outbox
    assert message.to == ["ops@example.com"] and message.subject == "Decision needed: Refund 7?"
    assert body["url"] in message.body
    claims = {e.payload["key"] for e in step_events(run, "side_effect_claimed", "review")}
    assert claims == {f"{run.id}:review:1:notify-email", f"{run.id}:review:1:notify-webhook"}
    assert set(SideEffect.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"delivered"}
    # Journaled before the notifications went out, once.
    order = kinds(run)
    assert order.count("approval_requested") == 1
    assert order.index("approval_requested") < order.index("side_effect_claimed")


def test_a_re_walk_of_the_parked_approval_sends_nothing_again(webhook_receiver):
    run = notified(webhook_receiver, extra_steps=[{"id": "ping", "kind": "signal", "name": "ping", "needs": []}])

    signal_send(run_id=run.id, name="ping", by="test")  # wakes the run: its walk meets the approval again
    drive(run)

    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "review"
    assert len(webhook_receiver.deliveries) == 1 and len(mail.outbox) == 1
    assert kinds(run).count("approval_requested") == 1


def test_a_crash_while_mailing_leaves_the_email_unconfirmed_and_never_sends_it_twice(settings, webhook_receiver):
    settings.MAILERS = mailer(CRASHING_MAIL)
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "?", "notify": {"email": ["a@example.com"]}}])
    with pytest.raises(Crash):
        drive(run)
    settings.MAILERS = mailer(LOCMEM_MAIL)

    sweep_after_expiry(run)
    drive_to_end(run)

    assert run.status == RunStatus.WAITING and mail.outbox == []
    effect = SideEffect.objects.get(run_id=run.id)
    assert (effect.key, effect.status) == (f"{run.id}:review:1:notify-email", "unconfirmed")
    assert kinds(run).count("approval_requested") == 1


def test_the_link_decides_once_and_a_second_use_is_410(webhook_receiver):
    run = notified(webhook_receiver)
    token = token_of(webhook_receiver)

    approval_decide_by_link(token=token, approved=True, comment="by mail")
    with pytest.raises(ServiceError) as again:
        approval_decide_by_link(token=token, approved=False)

    assert (again.value.status, again.value.code) == (410, "link_used")
    (decided,) = step_events(run, "approval_decided", "review")
    assert (decided.payload["by"], decided.payload["via"]) == ("link", "link")
    assert decided.payload["link"] and decided.payload["link"] not in token
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    everything = json.dumps([e.payload for e in JournalEvent.objects.filter(run_id=run.id)])
    assert token not in everything and token.split(":")[0] not in everything  # the token is never journaled


def test_a_link_without_link_decides_only_opens_the_approval(webhook_receiver):
    run = notified(webhook_receiver, link_decides=False)
    token = token_of(webhook_receiver)

    assert approval_link_open(token=token)["step_id"] == "review"
    with pytest.raises(ServiceError) as refused:
        approval_decide_by_link(token=token, approved=True)

    assert (refused.value.status, refused.value.code) == (403, "link_not_allowed")
    assert step_events(run, "approval_decided") == []


def test_an_altered_link_is_404_and_an_expired_one_410(settings, webhook_receiver):
    run = notified(webhook_receiver)
    token = token_of(webhook_receiver)

    with pytest.raises(ServiceError) as altered:
        approval_link_open(token=token[:-2] + ("AA" if not token.endswith("AA") else "BB"))
    old = link_token(run_id=run.id, step_id="review", attempt=1, opened_at=db_now() - timedelta(days=8))
    with pytest.raises(ServiceError) as expired:
        approval_link_open(token=old)

    assert (altered.value.status, altered.value.code) == (404, "link_invalid")
    assert (expired.value.status, expired.value.code) == (410, "link_expired")

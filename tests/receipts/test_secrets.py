"""No provider key, webhook secret, API token or SMTP password in a receipt, nor anywhere in the journal.

A workflow runs against the local LLM peer with an API key it checks and a webhook receiver with a secret it
checks (so both really were used), created through the API with a real token; then every string of the
receipt and of every journal row is searched for them."""

import json

import pytest
from django.test import override_settings

from journal.models import JournalEvent
from runs.models import Run
from runs.receipts import run_receipt
from tests.helpers import LOGIN_OUTBOX_MAIL, drive_to_end, mailer
from tests.support.peers import LLMProvider, WebhookReceiver

from .conftest import Api, make_user, token_for

pytestmark = pytest.mark.django_db

API_KEY = "sk-live-PROVIDER-KEY-4c1b9e0f7d"
HOOK_SECRET = "whsec-WEBHOOK-SECRET-88a1f3"
SMTP_PASSWORD = "smtp-PASSWORD-e6d2a9"


@pytest.fixture
def provider():
    with LLMProvider(api_key=API_KEY) as peer:
        yield peer


@pytest.fixture
def receiver():
    with WebhookReceiver(secret=HOOK_SECRET, reject_invalid=True) as peer:
        yield peer


def test_no_secret_is_in_a_receipt_or_in_the_journal(provider, receiver, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    token = token_for(make_user("otto", "runs.view_run", "runs.operate"))
    api = Api(token)
    definition = {
        "name": "secretive",
        "steps": [
            {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Summarise {{ input.ticket }}"},
            {
                "id": "notify",
                "kind": "deliver",
                "channel": "webhook",
                "url": receiver.url,
                "body": {"summary": "{{ steps.draft.output.text }}"},
            },
            {
                "id": "mail",
                "kind": "deliver",
                "channel": "email",
                "to": ["ops@example.com"],
                "subject": "done",
                "body": "{{ steps.draft.output.text }}",
            },
        ],
    }
    settings = dict(
        PAL_LLM_BASE_URL=provider.url,
        PAL_LLM_API_KEY=API_KEY,
        PAL_WEBHOOK_SECRET=HOOK_SECRET,
        MAILERS=mailer(LOGIN_OUTBOX_MAIL, username="pal", password=SMTP_PASSWORD),
        PAL_RECEIPT_PRIVATE_KEY=Ed25519PrivateKey.generate(),
    )
    with override_settings(**settings):
        assert api.post("/workflows", definition).status_code == 201
        created = api.post("/runs", {"workflow": "secretive", "input": {"ticket": "printer on fire"}})
        assert created.status_code == 201, created.content
        run = Run.objects.get(id=created.json()["id"])
        drive_to_end(run)
        assert run.status == "succeeded", run.error
        receipt_text = api.get(f"/runs/{run.id}/receipt").content.decode()

    # The secrets were really used: the provider and the receiver check them.
    assert [c.headers["Authorization"] for c in provider.calls] == [f"Bearer {API_KEY}"]
    assert [d.signature_valid for d in receiver.deliveries] == [True]

    receipt = json.loads(receipt_text)
    assert receipt["signature"] and receipt["totals"]["prompt_tokens"] > 0
    assert [e["status"] for s in receipt["steps"] for e in s["side_effects"]] == ["delivered", "delivered"]
    rows = json.dumps(
        [[e.kind, e.step_id, e.payload, e.writer, e.hash] for e in JournalEvent.objects.filter(run_id=run.id)]
    )
    for secret in (API_KEY, HOOK_SECRET, SMTP_PASSWORD, token):
        for where, text in (
            ("receipt", receipt_text),
            ("journal", rows),
            ("signed receipt", json.dumps(run_receipt(run_id=run.id))),
        ):
            assert secret not in text, f"{secret[:12]}… is in the {where}"
    # Nor a part of them long enough to matter (a token's secret half, a key's body).
    assert token[-20:] not in receipt_text and token[-20:] not in rows

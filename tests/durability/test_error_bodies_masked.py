"""A peer's error answer that quotes what it was sent never carries a configured secret into our surfaces
(issue 23, section 7): a provider's 401 echoing the Authorization header, a receiver's 400 echoing the body.

Masked in one place, the failure's journal form (StepError.as_payload) and a side effect's confirmation, so the
journal, the run's error, the side-effect row, the API and the pages all read "[redacted]".
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import RunStatus, SideEffect
from tests.helpers import QUICK, describe, events, llm, start_run, wait_for_end, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PROVIDER_KEY = "sk-echoed-" + uuid.uuid4().hex[:12]


def surfaces_of(run) -> str:
    """The run's journal, its row, its side effects, and its run page and step panels, as one text."""
    run.refresh_from_db()
    client = Client()
    client.force_login(User.objects.create_superuser(username=f"su-{uuid.uuid4().hex[:6]}", email="su@example.com"))
    texts = [json.dumps(row.payload) for row in events(run)]
    texts.append(json.dumps([run.output, run.error]))
    texts += [json.dumps(effect.response) for effect in SideEffect.objects.filter(run_id=run.id)]
    pages = [f"/runs/{run.id}/", *(f"/runs/{run.id}/steps/{e.step_id}/" for e in events(run) if e.step_id)]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, path
        texts.append(response.content.decode())
    return "\n".join(texts)


@pytest.fixture
def provider_key(settings):
    settings.PAL_LLM_API_KEY = PROVIDER_KEY  # this process masks it too (the pages it serves)
    return PROVIDER_KEY


def test_a_provider_401_that_echoes_the_authorization_header_is_journaled_masked(
    provider_key, celery_workers, llm_provider
):
    llm_provider.api_key = "sk-the-provider-wants-another"  # so our key is refused, and echoed back
    llm_provider.echo_on_error = True
    celery_workers({**llm_provider.env(), "PAL_LLM_API_KEY": provider_key}, name="echo-401", **QUICK)

    run = wait_for_end(start_run(llm("ask", "hello")), timeout=60)

    assert run.status == RunStatus.FAILED, describe(run)
    assert llm_provider.calls[0].headers["Authorization"] == f"Bearer {provider_key}"  # it was sent
    (failed,) = events(run, "step_failed", "ask")
    assert failed.payload["code"] == "provider_refused"
    assert "[redacted]" in failed.payload["message"]  # the echo is there, masked
    assert run.error["code"] == "provider_refused"
    assert provider_key not in surfaces_of(run)


def test_a_receiver_400_that_echoes_the_body_is_kept_masked(provider_key, celery_workers, webhook_receiver):
    webhook_receiver.echo_on_error = True
    webhook_receiver.fail_next(1, status=400)
    celery_workers({**webhook_receiver.env(), "PAL_LLM_API_KEY": provider_key}, name="echo-400", **QUICK)

    run = start_run(webhook("hook", webhook_receiver.url, {"note": f"the key is {provider_key}"}))
    run = wait_for_end(run, timeout=60)

    assert run.status == RunStatus.FAILED, describe(run)
    assert provider_key in webhook_receiver.requests[0].body.decode()  # the author's mistake reached the peer
    (effect,) = SideEffect.objects.filter(run_id=run.id)
    assert "[redacted]" in effect.response["body"]  # the receiver's excerpt is kept, masked
    assert provider_key not in surfaces_of(run)

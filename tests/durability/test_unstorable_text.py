"""A model whose answer holds text PostgreSQL cannot store (a NUL, an unpaired surrogate) no longer wedges its
run: a real worker stores the answer escaped, the run succeeds, and the answer reads back as the provider sent it
through the API, the journal, the event stream, the receipt and the run page (issue 10, section 4)."""

import hashlib
import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from journal.chain import chain_verify
from journal.services import dumps
from runs.streams import sse_message
from tests.helpers import QUICK, describe, echo, events, llm, start_run, wait_for_end
from tests.support.peers import LLMProvider
from tokens.services import token_create

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ANSWERS = [
    pytest.param("before\x00after, and a NUL at the end\x00", id="nul"),
    pytest.param("a lone \ud800 high and a lone \udc00 low surrogate", id="lone-surrogate"),
]


def viewer() -> tuple[Client, str]:
    user = User.objects.create_user(username="vera")
    user.user_permissions.add(Permission.objects.get(content_type__app_label="runs", codename="view_run"))
    client = Client()
    client.force_login(user)
    return client, token_create(user=user, name="test")[1]


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_model_answer_postgres_cannot_store_is_kept_as_it_came(celery_workers, llm_provider: LLMProvider, answer):
    llm_provider.reply = answer  # sent as JSON, so the surrogate goes over the wire as the escape "\ud800"
    celery_workers(llm_provider.env(), name="text", **QUICK)
    # The tool step's args are a template over the answer: a tool's output holding the same text.
    run = start_run(llm("answer", "Say something odd"), echo("repeat", said="{{ steps.answer.output.text }}"))
    run = wait_for_end(run, timeout=60)

    assert run.status == "succeeded", describe(run)
    assert run.output == {"said": answer}
    [completed] = events(run, "step_completed", "answer")
    assert completed.payload["output"]["text"] == answer
    [repeated] = events(run, "step_completed", "repeat")
    assert repeated.payload["output"] == {"said": answer}
    assert len(llm_provider.calls) == 1  # stored on the first try: no re-drive called the provider again
    assert chain_verify(run_id=run.id, expect_head=(run.journal_head_seq, run.journal_head_hash)).ok

    client, token = viewer()
    api = client.get(f"/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {token}"})
    assert api.status_code == 200, api.content[:500]
    assert api.json()["output"] == {"said": answer}
    page = client.get(f"/api/v1/runs/{run.id}/events", {"limit": 1000}, headers={"Authorization": f"Bearer {token}"})
    texts = [
        e["payload"]["output"]["text"]
        for e in page.json()["items"]
        if e["kind"] == "step_completed" and e["step_id"] == "answer"
    ]
    assert texts == [answer]
    streamed = sse_message(completed)
    assert json.loads(streamed.split("data: ", 1)[1])["payload"]["output"]["text"] == answer

    receipt = client.get(f"/api/v1/runs/{run.id}/receipt", headers={"Authorization": f"Bearer {token}"})
    assert receipt.status_code == 200, receipt.content[:500]
    steps = receipt.json()["steps"]
    assert [s["status"] for s in steps] == ["completed", "completed"]
    assert steps[0]["output_sha256"] == hashlib.sha256(dumps(completed.payload["output"]).encode()).hexdigest()
    assert client.get(f"/runs/{run.id}/receipt/").status_code == 200

    detail = client.get(f"/runs/{run.id}/")
    assert detail.status_code == 200
    # The page shows the answer as JSON: a NUL as \u0000 and a lone surrogate as the \ud800 it came as.
    shown = json.dumps(answer)[1:-1]
    assert shown in detail.content.decode("utf-8")

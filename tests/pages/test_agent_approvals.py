"""A tool call waiting on approve_tools on the run page and /ops/: its tool and arguments in the form, which
approves it as it is, with the arguments the operator edited, or refuses bad ones naming the field."""

import re

import pytest

from journal.models import JournalEvent
from runs.models import RunStatus
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive_to_end, make_run

from .conftest import htmx

pytestmark = pytest.mark.django_db


@pytest.fixture
def parked(settings, llm_provider):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    llm_provider.reply = refund_reply
    RAN.clear()
    run = make_run(steps=[refund_step()])
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    return run


def test_the_run_page_and_ops_show_the_tool_call_with_its_arguments(parked, operator):
    for page in (operator.get(f"/runs/{parked.id}/"), operator.get("/ops/")):
        text = page.content.decode()
        assert f'action="/runs/{parked.id}/approvals/agent%5B1.0%5D/"' in text
        assert "Run tool issue_refund?" in text
        textarea = re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', text, re.S)
        assert textarea and "&quot;amount&quot;: 120.0" in textarea.group(1), text[:2000]


def test_the_form_approves_with_the_arguments_the_operator_edited(parked, operator):
    answer = operator.post(
        f"/runs/{parked.id}/approvals/agent[1.0]/",
        {"approved": "1", "attempt": "1", "page": str(parked.id), "arguments": '{"invoice_id": 7, "amount": 99}'},
        headers=htmx("run-actions"),
    )
    assert answer.status_code == 200 and "Approved step agent[1.0]" in answer.content.decode()
    parked.refresh_from_db()
    drive_to_end(parked)
    assert parked.status == RunStatus.SUCCEEDED, parked.error
    assert RAN[0]["args"] == {"invoice_id": 7, "amount": 99.0}


def test_the_form_left_as_it_was_runs_the_models_arguments(parked, operator):
    page = operator.get(f"/runs/{parked.id}/").content.decode()
    shown = re.search(r'<textarea name="arguments"[^>]*>(.*?)</textarea>', page, re.S).group(1)
    shown = shown.replace("&quot;", '"')
    operator.post(
        f"/runs/{parked.id}/approvals/agent[1.0]/",
        {"approved": "1", "attempt": "1", "page": str(parked.id), "arguments": shown},
        headers=htmx("run-actions"),
    )
    parked.refresh_from_db()
    drive_to_end(parked)
    assert RAN[0]["args"] == {"invoice_id": 7, "amount": 120.0}
    started = JournalEvent.objects.get(run_id=parked.id, kind="step_started", step_id="agent[1.0]")
    assert "asked" not in started.payload["input"]  # no edit: nothing to keep beside what ran


def test_bad_edited_arguments_are_refused_on_the_page_naming_the_field(parked, operator):
    answer = operator.post(
        f"/runs/{parked.id}/approvals/agent[1.0]/",
        {"approved": "1", "attempt": "1", "page": str(parked.id), "arguments": '{"invoice_id": "seven"}'},
        headers=htmx("run-actions"),
    )
    text = answer.content.decode()
    assert "arguments.invoice_id" in text, text[:2000]
    parked.refresh_from_db()
    assert parked.status == RunStatus.WAITING and RAN == []

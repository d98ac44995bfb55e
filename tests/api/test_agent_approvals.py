"""POST /runs/{id}/approvals/{step}[{turn}.{n}]: an agent loop's tool call approved with edited arguments, or
refused with 422 naming the bad field."""

import pytest

from runs.models import RunStatus
from tests.api.conftest import assert_error
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive_to_end, make_run

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


def test_an_operator_approves_a_tool_call_with_edited_arguments(parked, operator):
    response = operator.post(
        f"/runs/{parked.id}/approvals/agent[1.0]",
        {"approved": True, "comment": "less", "arguments": {"invoice_id": 7, "amount": 50}},
    )
    assert response.status_code == 200, response.content
    parked.refresh_from_db()
    drive_to_end(parked)
    assert parked.status == RunStatus.SUCCEEDED, parked.error
    assert RAN[0]["args"] == {"invoice_id": 7, "amount": 50.0}


def test_bad_edited_arguments_answer_422_naming_the_field(parked, operator):
    response = operator.post(
        f"/runs/{parked.id}/approvals/agent[1.0]",
        {"approved": True, "arguments": {"invoice_id": 7, "amount": "lots"}},
    )
    body = assert_error(response, 422, "invalid_arguments")
    assert "arguments.amount" in response.json()["detail"], body
    parked.refresh_from_db()
    assert parked.status == RunStatus.WAITING

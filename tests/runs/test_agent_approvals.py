"""approve_tools: an agent loop parks before such a tool call with its arguments; the operator approves, rejects
or edits them (through the service the API and the pages call); the journal keeps both."""

import pytest

from journal.models import JournalEvent
from runs.errors import ServiceError
from runs.explain import run_why
from runs.models import RunStatus
from runs.selectors import approvals_pending
from runs.services import approval_decide
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive_to_end, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def provider(settings, llm_provider):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    llm_provider.reply = refund_reply
    RAN.clear()
    return llm_provider


def parked():
    run = make_run(steps=[refund_step()])
    drive_to_end(run)
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_the_run_parks_before_the_tool_call_with_its_arguments_and_runs_nothing(provider):
    run = parked()
    assert run.waiting_on == {
        "kind": "approval",
        "step_id": "agent[1.0]",
        "attempt": 1,
        "prompt": "Run tool issue_refund?",
        "tool": "issue_refund",
        "arguments": {"invoice_id": 7, "amount": 120.0},
        "of": "agent",
    }
    assert RAN == [] and len(provider.billed) == 1
    [pending] = approvals_pending(run_ids=[run.id])
    assert pending.step_id == "agent[1.0]" and pending.wait["tool"] == "issue_refund"
    assert "agent[1.0]" in run_why(run)
    requested = JournalEvent.objects.get(run_id=run.id, kind="approval_requested")
    assert requested.step_id == "agent" and requested.payload["call"] == "agent[1.0]"


def test_an_approval_runs_the_tool_with_the_models_arguments(provider):
    run = parked()
    approval_decide(run_id=run.id, step_id="agent[1.0]", approved=True, by="alice")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [(r["tool"], r["key"], r["args"]) for r in RAN] == [
        ("issue_refund", f"{run.id}:agent[1.0]:1", {"invoice_id": 7, "amount": 120.0})
    ]
    call = run.output["turns"][0]["tool_calls"][0]
    assert call["result"] == {"refunded": 120.0, "invoice_id": 7}
    assert len(provider.billed) == 2 and len(provider.calls) == 2  # the first turn was not asked for again


def test_edited_arguments_reach_the_tool_and_the_journal_keeps_both(provider):
    run = parked()
    approval_decide(
        run_id=run.id, step_id="agent[1.0]", approved=True, by="alice", arguments={"invoice_id": 7, "amount": 100}
    )
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert RAN[0]["args"] == {"invoice_id": 7, "amount": 100.0}
    started = JournalEvent.objects.get(run_id=run.id, kind="step_started", step_id="agent[1.0]")
    assert started.payload["input"]["args"] == {"invoice_id": 7, "amount": 100}
    assert started.payload["input"]["asked"] == {"invoice_id": 7, "amount": 120.0}
    decided = JournalEvent.objects.get(run_id=run.id, kind="approval_decided", step_id="agent[1.0]")
    assert decided.payload["arguments"] == {"invoice_id": 7, "amount": 100} and decided.payload["by"] == "alice"


def test_a_rejection_runs_nothing_and_tells_the_model_which_goes_on(provider):
    run = parked()
    approval_decide(run_id=run.id, step_id="agent[1.0]", approved=False, by="alice", comment="too much")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert RAN == []
    assert run.output["turns"][0]["tool_calls"][0]["result"] == {"rejected": True, "by": "alice", "comment": "too much"}
    assert "rejected" in run.output["text"]
    failed = JournalEvent.objects.get(run_id=run.id, kind="step_failed", step_id="agent[1.0]")
    assert failed.payload["code"] == "tool_rejected"


def test_edited_arguments_that_do_not_fit_the_tool_are_refused_naming_the_field(provider):
    run = parked()
    with pytest.raises(ServiceError) as caught:
        approval_decide(run_id=run.id, step_id="agent[1.0]", approved=True, by="alice", arguments={"invoice_id": "x"})
    assert caught.value.status == 422 and caught.value.code == "invalid_arguments"
    assert "arguments.invoice_id" in caught.value.detail, caught.value.detail
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING  # nothing was decided


def test_arguments_for_a_plain_approval_are_refused():
    run = make_run(steps=[{"id": "ok", "kind": "approval", "prompt": "Go?"}])
    drive_to_end(run)
    with pytest.raises(ServiceError) as caught:
        approval_decide(run_id=run.id, step_id="ok", approved=True, by="alice", arguments={"a": 1})
    assert caught.value.code == "invalid_arguments"

"""The inbox's one rule (runs.selectors.decisions_open): every open decision of every run, of each kind (an approval,
a child's approval, a tool call waiting for its approval, a reached budget, a Python workflow's diverged code), and
the counts /ops/ shows from the same list."""

import pytest

from runs.code import WORKFLOWS
from runs.models import Run
from runs.selectors import decisions_count, decisions_open
from runs.services import approval_decide, workflow_create
from tests.code import sample_workflows
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive, drive_to_end, make_run, make_workflow

pytestmark = pytest.mark.django_db


def llm(step_id: str) -> dict:
    return {"id": step_id, "kind": "llm_call", "provider": "fake", "model": "gpt-4o-mini", "prompt": "one two three"}


def parked_on_budget() -> Run:
    workflow = workflow_create(
        definition={"name": "inbox-budget", "budget": {"max_tokens": 1}, "steps": [llm("a"), llm("b")]}
    )
    run = make_run(workflow=workflow)
    drive_to_end(run)
    assert run.waiting_on["kind"] == "budget"
    return run


def parked_on_nondeterminism(monkeypatch) -> Run:
    run = Run.objects.get(id=sample_workflows.py_everything.start({"sleep": 0}))
    drive_to_end(run)

    def changed(ctx, input):  # a deploy that put a step before the ones the journal holds
        sample_workflows.double(5)
        return sample_workflows.py_everything.code.fn(ctx, input)

    monkeypatch.setattr(WORKFLOWS["py-everything"], "fn", changed)
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")
    drive_to_end(run)
    assert run.waiting_on["kind"] == "nondeterminism"
    return run


def test_every_kind_of_open_decision_is_in_the_inbox_once(settings, llm_provider, monkeypatch):
    plain = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(plain)
    child_workflow = make_workflow(steps=[{"id": "inner", "kind": "approval", "prompt": "inner ok?"}])
    parent = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": child_workflow.name, "input": {}}])
    drive(parent)
    child = Run.objects.get(parent_run_id=parent.id)
    budget = parked_on_budget()
    diverged = parked_on_nondeterminism(monkeypatch)
    settings.PAL_LLM_BASE_URL = llm_provider.url
    llm_provider.reply = refund_reply
    RAN.clear()
    agent = make_run(steps=[refund_step()])
    drive_to_end(agent)

    found = {(d.run.id, d.kind, d.step_id) for d in decisions_open()}

    assert found == {
        (plain.id, "approval", "review"),
        (child.id, "approval", "inner"),
        (budget.id, "budget", budget.waiting_on.get("step_id") or ""),
        (diverged.id, "nondeterminism", ""),
        (agent.id, "tool_call", "agent[1.0]"),
    }
    counts = decisions_count()
    assert counts == {"approval": 2, "tool_call": 1, "budget": 1, "nondeterminism": 1, "total": 5}
    assert [d.run.id for d in decisions_open(kind="tool_call")] == [agent.id]


def test_a_decided_approval_leaves_the_inbox():
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(run)
    assert [d.run.id for d in decisions_open()] == [run.id]

    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")

    assert decisions_open() == []

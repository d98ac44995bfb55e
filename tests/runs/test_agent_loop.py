"""The agent loop of an llm_call with tools, in-process against the local provider: turns, keys, tool items,
results sent back as role: tool messages, max_turns, a crash mid-loop, budgets, Python's ctx.llm."""

import dataclasses
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from journal.models import JournalEvent
from runs.models import RateSlot, Run, RunStatus
from runs.rate_limits import SEND_MARGIN, WINDOW
from runs.services import run_budget_raise, run_wake_timer, workflow_create
from runs.steps.tools import TOOLS, typed_tool
from runs.workflows import WorkflowInvalid
from tests.code import agent_tools
from tests.code.agent_tools import RAN
from tests.helpers import Crash, drive, drive_to_end, make_run, make_workflow, sweep_after_expiry
from tests.support.peers import agent_reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def provider(settings, llm_provider):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    RAN.clear()
    return llm_provider


def agent_step(**more) -> dict:
    step = {"id": "agent", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "find things", "tools": ["lookup"]}
    return {**step, **more}


def test_a_loop_of_three_turns_runs_each_tool_call_as_an_item_with_its_own_key(provider):
    provider.reply = agent_reply(turns=3, calls=2, tool="lookup")
    run = make_run(steps=[agent_step()])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.output
    assert [len(t["tool_calls"]) for t in out["turns"]] == [2, 2, 0]
    assert out["turns"][0]["tool_calls"][1] == {
        "id": out["turns"][0]["tool_calls"][1]["id"],
        "name": "lookup",
        "arguments": {"turn": 1, "n": 1},
        "result": {"found": "thing 1.1"},
        "key": f"{run.id}:agent[1.1]:1",
    }
    assert out["text"].startswith("done after 4 tool results"), out["text"]
    assert out["usage"]["prompt_tokens"] == sum(t["usage"]["prompt_tokens"] for t in out["turns"])
    # Each model turn under its own key, billed once; each tool call under its item's key, run once.
    assert provider.billed == {f"{run.id}:agent:1:turn{t}": 1 for t in (1, 2, 3)}
    assert [line["key"] for line in RAN] == [f"{run.id}:agent[{t}.{n}]:1" for t in (1, 2) for n in (0, 1)]
    started = JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id="agent[2.0]").get()
    assert started.payload["input"] == {"tool": "lookup", "args": {"turn": 2, "n": 0}}
    assert JournalEvent.objects.filter(run_id=run.id, kind="llm_turn", step_id="agent").count() == 3


def test_the_model_is_offered_the_tools_schema_and_gets_the_results_as_tool_messages(provider):
    provider.reply = agent_reply(turns=2, calls=1, tool="lookup")
    run = make_run(steps=[agent_step()])
    drive_to_end(run)
    first, second = (call.json for call in provider.calls)
    offered = first["tools"][0]
    assert offered["type"] == "function" and offered["function"]["name"] == "lookup"
    assert offered["function"]["parameters"]["properties"] == {
        "turn": {"title": "Turn", "type": "integer"},
        "n": {"title": "N", "type": "integer"},
    }
    assert offered["function"]["parameters"]["required"] == ["turn", "n"]
    assistant, tool_message = second["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["function"]["name"] == "lookup"
    assert tool_message == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "content": json.dumps({"found": "thing 1.0"}),
    }


def test_a_model_still_asking_for_tools_at_max_turns_fails_the_step_with_max_turns(provider):
    provider.reply = agent_reply(turns=10, calls=1, tool="lookup")
    run = make_run(steps=[agent_step(max_turns=3)])
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "max_turns" and run.error["details"]["max_turns"] == 3, run.error
    assert len(provider.billed) == 3 and len(RAN) == 2  # the third turn's calls were not run


def test_the_default_max_turns_is_eight_model_calls(provider):
    provider.reply = agent_reply(turns=1000, calls=1, tool="lookup")  # asks for a tool for ever
    run = Run.objects.get(id=agent_tools.py_agent.start({"ask": "never done"}))  # ctx.llm without max_turns
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "max_turns" and run.error["details"]["max_turns"] == 8, run.error
    assert provider.billed == {f"{run.id}:llm:1:turn{t}": 1 for t in range(1, 9)}
    assert len(RAN) == 7  # the eighth turn's call was not run


def test_a_tool_whose_parameter_is_a_pydantic_model_is_offered_its_schema_and_gets_the_model(provider):
    good = {"request": {"invoice_id": 7, "amount": 12.5}}
    provider.reply = agent_reply(turns=2, calls=1, tool="file_refund", arguments=lambda t, n: good)
    run = make_run(steps=[agent_step(tools=["file_refund"])])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    parameters = provider.calls[0].json["tools"][0]["function"]["parameters"]
    assert parameters["required"] == ["request"] and parameters["additionalProperties"] is False
    model = parameters["$defs"]["RefundRequest"]
    assert parameters["properties"]["request"] == {"$ref": "#/$defs/RefundRequest"}
    assert model["properties"]["amount"] == {"exclusiveMinimum": 0, "title": "Amount", "type": "number"}
    assert model["required"] == ["invoice_id", "amount"]
    result = run.output["turns"][0]["tool_calls"][0]["result"]
    assert result == {"filed": 7, "amount": 12.5, "as": "RefundRequest"}
    assert RAN[0]["args"] == {"request": {"invoice_id": 7, "amount": 12.5, "reason": ""}}


def test_arguments_that_do_not_fit_a_pydantic_parameter_go_back_to_the_model_naming_the_field(provider):
    bad = {"request": {"invoice_id": 7, "amount": -3}}
    provider.reply = agent_reply(turns=2, calls=1, tool="file_refund", arguments=lambda t, n: bad)
    run = make_run(steps=[agent_step(tools=["file_refund"])])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    result = run.output["turns"][0]["tool_calls"][0]["result"]
    assert result["code"] == "bad_args" and "request.amount" in result["error"], result
    assert RAN == []


def test_bad_arguments_from_the_model_go_back_to_it_as_an_error_naming_the_field(provider):
    provider.reply = agent_reply(turns=2, calls=1, tool="lookup", arguments=lambda t, n: {"turn": "first", "n": n})
    run = make_run(steps=[agent_step()])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    result = run.output["turns"][0]["tool_calls"][0]["result"]
    assert result["code"] == "bad_args" and "turn" in result["error"], result
    assert RAN == []
    failed = JournalEvent.objects.get(run_id=run.id, kind="step_failed", step_id="agent[1.0]")
    assert failed.payload["details"]["field"] == "turn"


def test_a_crash_mid_loop_resumes_at_its_turn_calling_no_model_and_running_no_tool_again(provider, monkeypatch):
    provider.reply = agent_reply(turns=4, calls=2, tool="lookup")
    run = make_run(steps=[agent_step()])
    real = agent_tools.lookup.pal_tool.run
    crashed: list[str] = []

    def crash_at_turn_three(args, ctx):
        if args.get("turn") == 3 and args.get("n") == 1 and not crashed:
            crashed.append(ctx.key)
            raise Crash("the worker dies after turn 3's first tool call")
        return real(args, ctx)

    monkeypatch.setitem(TOOLS, "lookup", dataclasses.replace(TOOLS["lookup"], run=crash_at_turn_three))
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert crashed == [f"{run.id}:agent[3.1]:1"]
    assert provider.billed == {f"{run.id}:agent:1:turn{t}": 1 for t in (1, 2, 3, 4)}
    assert len(provider.calls) == 4  # the journaled turns were read back: no call made again
    keys = [line["key"] for line in RAN]
    assert keys == [f"{run.id}:agent[{t}.{n}]:1" for t in (1, 2, 3) for n in (0, 1)], keys
    resumed = JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id="agent[3.1]")
    assert [e.payload.get("resumed", False) for e in resumed.order_by("seq")] == [False, True]


def test_a_budget_parks_the_loop_between_turns_and_a_raise_lets_it_go_on(provider):
    provider.reply = agent_reply(turns=3, calls=1, tool="lookup")
    workflow = make_workflow(steps=[agent_step()])
    definition = {**workflow.definition, "budget": {"max_tokens": 5}}
    workflow = workflow_create(definition=definition)
    run = make_run(workflow=workflow)
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "budget", run.waiting_on
    assert run.waiting_on["step_id"] == "agent" and len(provider.billed) == 1
    run_budget_raise(run_id=run.id, max_tokens=100_000, by="alice", reason="let it finish")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(provider.billed) == 3 and len(provider.calls) == 3


@pytest.mark.parametrize(
    ("more", "field"),
    [
        ({"tools": ["nope"]}, "(agent).tools[0]"),
        ({"tools": []}, "(agent).tools"),
        ({"max_turns": 0}, "(agent).max_turns"),
        ({"approve_tools": ["issue_refund"]}, "(agent).approve_tools[0]"),
    ],
)
def test_a_bad_tools_field_is_refused_when_the_workflow_is_posted(more, field):
    with pytest.raises(WorkflowInvalid) as caught:
        make_workflow(steps=[agent_step(**more)])
    assert field in str(caught.value.errors), caught.value.errors


def test_ctx_llm_with_tools_runs_the_loop_in_a_python_workflow(provider):
    provider.reply = agent_reply(turns=2, calls=2, tool="lookup")
    run = Run.objects.get(id=agent_tools.py_agent.start({"ask": "look"}))
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output["turns"] == 2
    assert provider.billed == {f"{run.id}:llm:1:turn1": 1, f"{run.id}:llm:1:turn2": 1}
    assert [line["key"] for line in RAN] == [f"{run.id}:llm[1.0]:1", f"{run.id}:llm[1.1]:1"]


def test_tool_arguments_under_secret_named_keys_are_redacted_in_the_journal(provider):
    provider.reply = agent_reply(turns=2, calls=1, tool="echo", arguments=lambda t, n: {"api_key": "sk-live-1", "q": 1})
    run = make_run(steps=[agent_step(tools=["echo"])])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    started = JournalEvent.objects.get(run_id=run.id, kind="step_started", step_id="agent[1.0]")
    assert started.payload["input"]["args"] == {"api_key": "[redacted]", "q": 1}


def test_a_tool_not_registered_where_the_loop_runs_fails_the_step_before_any_model_call(provider, monkeypatch):
    provider.reply = agent_reply(turns=2, calls=1, tool="lookup")
    run = make_run(steps=[agent_step()])
    monkeypatch.delitem(TOOLS, "lookup")
    drive_to_end(run)
    assert run.status == RunStatus.FAILED and run.error["code"] == "unknown_tool", run.error
    assert provider.calls == []


def test_a_rate_limit_holds_the_loop_between_model_calls_and_it_goes_on_at_its_turn(provider, settings):
    settings.PAL_RATE_LIMITS = {"llm:gpt-4o-mini": {"requests_per_minute": 2}}
    provider.reply = agent_reply(turns=3, calls=1, tool="lookup")
    run = make_run(steps=[agent_step()])
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "rate_limit", run.waiting_on
    assert run.waiting_on["step_id"] == "agent" and len(provider.billed) == 2 and len(RAN) == 2
    RateSlot.objects.update(started_at=timezone.now() - WINDOW - SEND_MARGIN - timedelta(seconds=1))
    Run.objects.filter(id=run.id).update(wake_at=timezone.now() - timedelta(seconds=1))
    assert run_wake_timer(run_id=run.id)
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert provider.billed == {f"{run.id}:agent:1:turn{t}": 1 for t in (1, 2, 3)} and len(provider.calls) == 3
    assert len(RAN) == 2  # the tools of the turns before the wait did not run again


def test_a_second_function_under_a_tool_name_already_taken_is_refused_naming_both():
    def issue_refund(invoice_id: int) -> dict:
        return {}

    with pytest.raises(ValueError, match=r"'issue_refund' is registered twice: tests\.code\.agent_tools\.refund and"):
        typed_tool(issue_refund)
    assert TOOLS["issue_refund"].path == "tests.code.agent_tools.refund"
    assert typed_tool(agent_tools.refund, name="issue_refund").path == "tests.code.agent_tools.refund"  # a re-import

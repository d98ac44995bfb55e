"""The step panel of an agent loop: the conversation turn by turn (each model message with its tokens and cost,
each tool call with its arguments and result), a tool call's own panel, and the API's step detail agreeing."""

import re

import pytest

from runs.models import RunStatus
from tests.api.conftest import Api, token_for
from tests.api.conftest import make_user as make_api_user
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive_to_end, make_run
from tests.support.peers import agent_reply

from .conftest import htmx

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(settings, llm_provider):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    RAN.clear()
    return llm_provider


def finished_loop(provider):
    provider.reply = agent_reply(turns=3, calls=2, tool="lookup")
    step = {"id": "agent", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "find things", "tools": ["lookup"]}
    run = make_run(steps=[step])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def test_the_panel_shows_each_turn_with_its_tokens_and_each_tool_call_with_arguments_and_result(provider, viewer):
    run = finished_loop(provider)
    page = viewer.get(f"/runs/{run.id}/steps/agent/", headers=htmx("step-panel")).content.decode()
    turns = re.findall(r'aria-label="turn (\d+)"', page)
    assert turns == ["1", "2", "3"], page[:3000]
    for number, turn in enumerate(run.output["turns"], start=1):
        tokens = turn["usage"]["prompt_tokens"] + turn["usage"]["completion_tokens"]
        assert f"turn {number} · {'answer' if number == 3 else 'assistant'} · {tokens} tokens" in page
    assert page.count('aria-label="tool call agent[') == 4
    assert "&quot;turn&quot;: 2" in page and "&quot;found&quot;: &quot;thing 2.1&quot;" in page
    assert "done after 4 tool results" in page  # the last turn's answer
    assert f"{run.id}:agent:1:turn2" in page  # each turn's own key


def test_a_tool_call_has_a_panel_of_its_own(provider, viewer):
    run = finished_loop(provider)
    answer = viewer.get(f"/runs/{run.id}/steps/agent[2.1]/", headers=htmx("step-panel"))
    assert answer.status_code == 200
    page = answer.content.decode()
    assert f"{run.id}:agent[2.1]:1" in page and "tool_call" in page and "thing 2.1" in page


def test_a_tool_call_waiting_for_approval_reads_waiting_in_the_panel(provider, viewer):
    provider.reply = refund_reply
    run = make_run(steps=[refund_step()])
    drive_to_end(run)
    page = viewer.get(f"/runs/{run.id}/steps/agent/", headers=htmx("step-panel")).content.decode()
    assert re.search(
        r"issue_refund</strong>.*?agent\[1\.0\]</a> <span class=\"status status-step-waiting\">", page, re.S
    )


def test_the_api_step_detail_has_the_same_turns(provider):
    run = finished_loop(provider)
    api = Api(token_for(make_api_user("vic", "runs.view_run")))
    body = api.get(f"/runs/{run.id}/steps/agent").json()
    [attempt] = body["attempts"]
    assert [t["turn"] for t in attempt["turns"]] == [1, 2, 3]
    call = attempt["turns"][1]["tool_calls"][0]
    assert call["step_id"] == "agent[2.0]" and call["status"] == "completed"
    assert call["arguments"] == {"turn": 2, "n": 0} and call["result"] == {"found": "thing 2.0"}
    assert attempt["turns"][2]["prompt_tokens"] == run.output["turns"][2]["usage"]["prompt_tokens"]


def test_the_run_page_draws_the_loop_and_its_tool_calls_on_the_waterfall(provider, viewer):
    run = finished_loop(provider)
    page = viewer.get(f"/runs/{run.id}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "agent[1.0]" in text and "agent[2.1]" in text
    assert viewer.get(f"/runs/{run.id}/receipt/").status_code in (200, 302)

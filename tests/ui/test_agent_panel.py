"""An agent loop's step panel in a real browser: a click on its waterfall bar draws the conversation turn by turn
(each model message with tokens and cost, each tool call with its arguments and result); a tool call's link opens
its own panel. A screenshot goes to docs/screenshots/agent-panel.png."""

import pytest

from runs.models import RunStatus
from tests.code.agent_tools import RAN
from tests.helpers import drive_to_end, make_run
from tests.support.peers import agent_reply

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, screenshot, site  # noqa: F401
from tests.ui.test_step_panel import bar_of, panel_violations

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def agent_run(transactional_db, settings, llm_provider):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    llm_provider.reply = agent_reply(turns=3, calls=2, tool="lookup", text="Found them")
    RAN.clear()
    step = {"id": "agent", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Find the things", "tools": ["lookup"]}
    run = make_run(steps=[step])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def test_the_agent_loops_panel_reads_turn_by_turn_and_opens_a_tool_call(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
    agent_run,
):
    run = agent_run
    page.goto(f"{site}/runs/{run.id}/")
    panel = page.locator("#step-panel")

    bar_of(page, "agent").click()

    expect(panel.locator("#step-panel-title")).to_contain_text("agent")
    turns = panel.locator(".sp-turn")
    expect(turns).to_have_count(3)
    expect(turns.nth(0).locator(".sp-tool-call")).to_have_count(2)
    expect(turns.nth(1).locator(".sp-tool-call").nth(1)).to_contain_text('"turn": 2')
    expect(turns.nth(1).locator(".sp-tool-call").nth(1)).to_contain_text("thing 2.1")
    first = run.output["turns"][0]
    tokens = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    expect(turns.nth(0)).to_contain_text(f"turn 1 · assistant · {tokens} tokens")
    expect(turns.nth(2).locator(".sp-answer")).to_contain_text("Found them after 4 tool results")
    assert panel_violations(page) == []
    screenshot(page, "agent-panel.png")

    turns.nth(0).locator(".sp-tool-call").nth(1).locator("a.sp-link").click()
    expect(panel.locator("#step-panel-title")).to_contain_text("agent[1.1]")
    expect(panel).to_contain_text(f"{run.id}:agent[1.1]:1")
    expect(panel).to_contain_text("thing 1.1")

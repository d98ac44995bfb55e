"""The run page's step panel in a real browser (headless Chromium through Playwright, against uvicorn on the test
database, as tests/ui/test_browser.py starts them): a click on a model call's waterfall bar opens its panel,
which reads as a conversation (the messages, then the answer with tokens and cost); a journal row opens its step
too; the address then deep-links to the step, and opening that link opens the panel on load. A screenshot of the
panel goes to docs/screenshots/step-panel.png."""

import importlib.resources

import pytest

from runs.models import RunStatus
from tests.helpers import drive_to_end, make_run, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, screenshot, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
# axe-core as tests/ui/test_accessibility.py reads it (the axe-playwright-python package bundles its build).
AXE = importlib.resources.files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")


def panel_violations(window) -> list[str]:
    """axe-core's serious and critical violations inside the open step panel."""
    window.evaluate(AXE)
    found = window.evaluate("async () => (await axe.run('#step-panel', {resultTypes: ['violations']})).violations")
    return [
        f"{v['id']} [{v['impact']}] on {', '.join(' '.join(n['target']) for n in v['nodes'][:6])}: {v['help']}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def bar_of(window, step_id: str):
    row = window.locator("#waterfall .wf-row").filter(has=window.locator(f'.wf-label > .mono:text-is("{step_id}")'))
    return row.locator(".wf-bar").first


@pytest.fixture
def model_run(transactional_db):
    run = make_run(
        steps=[
            tool_step("lookup", "echo", {"ticket": "{{ input.ticket }}"}),
            {
                "id": "draft",
                **LLM,
                "messages": [
                    {"role": "system", "content": "You answer support tickets in one friendly sentence."},
                    {"role": "user", "content": "Draft a reply to: {{ input.ticket }}"},
                ],
            },
            tool_step("read", "echo", {"source": "{{ item }}"}, needs=["draft"], for_each="{{ input.sources }}"),
        ],
        input={"ticket": "The export button does nothing", "sources": ["faq", "changelog"]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    return run


def test_a_click_on_a_model_calls_bar_opens_its_conversation_and_the_address_deep_links_to_it(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
    model_run,
):
    run = model_run
    page.goto(f"{site}/runs/{run.id}/")
    panel = page.locator("#step-panel")

    bar_of(page, "draft").click()

    expect(panel.locator("#step-panel-title")).to_contain_text("draft")
    messages = panel.locator(".sp-message")
    expect(messages).to_have_count(3)
    expect(messages.nth(0)).to_contain_text("system")
    expect(messages.nth(0)).to_contain_text("You answer support tickets in one friendly sentence.")
    expect(messages.nth(1)).to_contain_text("Draft a reply to: The export button does nothing")
    answer = panel.locator(".sp-answer")
    expect(answer).to_contain_text("[fake gpt-4o-mini")
    expect(answer).to_contain_text("tokens")
    expect(panel).to_contain_text(f"{run.id}:draft:1")
    expect(panel).to_be_focused()
    assert page.url.endswith(f"/runs/{run.id}/#step-draft")
    assert panel_violations(page) == []
    screenshot(page, "step-panel.png")

    # A journal row opens its step: an item of the for_each step, with its input.
    page.locator("#journal-rows tr.ev.k-step_completed").filter(has_text="read[1]").locator("td.kind").click()
    expect(panel.locator("#step-panel-title")).to_contain_text("read[1]")
    expect(panel).to_contain_text("changelog")
    assert page.url.endswith("#step-read[1]") or page.url.endswith("#step-read%5B1%5D")

    # Close closes it; the address no longer names a step.
    panel.locator(".sp-close").click()
    expect(page.locator("#step-panel")).to_be_hidden()
    assert "#step-" not in page.url


def test_the_deep_link_opens_the_panel_on_load_and_a_bar_opens_from_the_keyboard(
    page,  # noqa: F811
    site,  # noqa: F811
    model_run,
):
    run = model_run
    page.goto(f"{site}/runs/{run.id}/#step-lookup")

    panel = page.locator("#step-panel")
    expect(panel.locator("#step-panel-title")).to_contain_text("lookup")
    expect(panel).to_contain_text("The export button does nothing")  # the tool's input

    bar = bar_of(page, "draft")
    bar.focus()
    page.keyboard.press("Enter")
    expect(panel.locator("#step-panel-title")).to_contain_text("draft")
    expect(panel.locator(".sp-answer")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#step-panel")).to_be_hidden()
    expect(bar).to_be_focused()  # focus goes back to the bar that opened it


def test_the_receipts_table_counts_item_attempts_only_for_the_fan_out(
    page,  # noqa: F811
    site,  # noqa: F811
    model_run,
):
    """A plain step's row once read "20 item attempts (in the JSON)": Django's template lookup found the step
    dict's items() method where the key is absent (issue 23, section 7)."""
    page.goto(f"{site}/runs/{model_run.id}/")
    rows = page.locator("#receipt table.receipt-steps tbody tr")
    expect(rows.first).to_be_visible()  # the receipt comes in by htmx after the page

    def row(step_id: str):
        return rows.filter(has=page.locator(f'td.mono:text-is("{step_id}")'))

    for plain in ("lookup", "draft"):
        expect(row(plain)).to_have_count(1)
        expect(row(plain)).not_to_contain_text("item attempt")
    expect(row("read")).to_contain_text("2 item attempts (in the JSON)")

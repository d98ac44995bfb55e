"""The compare page in a real browser (headless Chromium through Playwright, against uvicorn on the test database,
as tests/ui/test_browser.py starts them): an operator finds two runs of a workflow by their input on the runs page,
compares them, and opens the step whose answer changed from the keyboard; the page passes axe-core. The screenshot
goes to docs/screenshots/compare.png."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_accessibility import BLOCKING, axe_violations, described
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, screenshot, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}


def test_an_operator_finds_two_runs_by_input_and_compares_them_step_by_step(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    workflow = make_workflow(
        name="support-triage",
        steps=[
            echo_step("fetch", ticket="T-1"),
            tool_step("summary", "echo", {"text": "{{ input.note }}", "customer": "{{ input.customer }}"}),
            {"id": "draft", **LLM, "prompt": "Reply to: {{ input.note }}"},
            tool_step("notify", "echo", {"sent": True}, for_each="{{ input.to }}"),
        ],
    )
    before = make_run(
        workflow=workflow, input={"customer": "acme", "note": "The printer is on fire again", "to": ["a", "b"]}
    )
    after = make_run(
        workflow=workflow, input={"customer": "acme", "note": "The printer is jammed again", "to": ["a", "b"]}
    )
    other = make_run(workflow=workflow, input={"customer": "globex", "note": "hi", "to": []})
    for run in (before, after, other):
        drive_to_end(run)
        assert run.status == RunStatus.SUCCEEDED

    # The runs page: the input filter keeps the two runs of acme.
    page.fill("input[name=input]", '{"customer": "acme"}')
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/runs/?*input=*")
    expect(page.locator("tr.run-row")).to_have_count(2)
    expect(page.locator(f'tr.run-row[data-run="{other.id}"]')).to_have_count(0)

    page.get_by_role("link", name="compare two runs").click()
    page.fill("input[name=a]", str(before.id))
    page.fill("input[name=b]", str(after.id))
    page.get_by_role("button", name="Compare").click()
    page.wait_for_selector("table.cmp-steps")
    rows = page.locator("tr.cmp-row")
    expect(rows).to_have_count(6)  # fetch, summary, draft, notify and its two items
    expect(page.locator('tr[data-step="fetch"]')).to_have_attribute("data-same", "yes")
    expect(page.locator('tr[data-step="notify[1]"]')).to_have_attribute("data-same", "yes")
    summary = page.locator('tr[data-step="summary"]')
    expect(summary).to_have_attribute("data-same", "no")
    expect(page.locator('tr[data-step="draft"]')).to_have_attribute("data-same", "no")
    expect(page.locator(".cmp-summary")).to_contain_text("2 steps with a different output.")
    expect(page.locator('tr[data-step="notify"] .cmp-figures').first).to_contain_text("2 items")
    expect(page.locator('tr[data-step="fetch"] .cmp-figures').first).not_to_contain_text("items")

    # From the keyboard: focus the summary step's diff and open it.
    toggle = summary.locator("details summary")
    toggle.focus()
    page.keyboard.press("Enter")
    change = summary.locator('.cmp-change[data-path="text"]')
    expect(change.locator("del")).to_have_text("on fire")
    expect(change.locator("ins")).to_have_text("jammed")
    page.locator('tr[data-step="draft"] details summary').click()

    blocking = [v for v in axe_violations(page) if v["impact"] in BLOCKING]
    assert blocking == [], described(blocking)
    screenshot(page, "compare.png")

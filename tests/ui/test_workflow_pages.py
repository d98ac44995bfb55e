"""The workflow pages in a real browser (headless Chromium through Playwright, against uvicorn on the test database,
as tests/ui/test_browser.py starts them): the list, a workflow page with its graph and charts, and an operator
starting a run from the form, first with a bad input (refused by field, nothing started) and then a good one (sent
from the keyboard). The workflow page's screenshot goes to docs/screenshots/workflow.png."""

import pytest

from runs.models import Run, RunStatus
from runs.services import workflow_create
from tests.helpers import drive_to_end, make_run, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, screenshot, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
RESEARCH = {
    "name": "research",
    "description": "plan, look in two places, then write it up",
    "steps": [
        {"id": "plan", **LLM, "prompt": "Plan: {{ input.q }}"},
        tool_step("web", "echo", {"q": "{{ input.q }}"}, needs=["plan"]),
        tool_step("papers", "echo", {"q": "{{ input.q }}"}, needs=["plan"]),
        {"id": "write", **LLM, "prompt": "Write up {{ steps.web.output.q }}", "needs": ["web", "papers"]},
    ],
}


def test_an_operator_reads_the_workflows_and_starts_a_run_from_the_form(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    workflow_create(definition={**RESEARCH, "steps": RESEARCH["steps"][:2]})
    latest = workflow_create(definition=RESEARCH)
    for q in ("durable runs", "leases", "journals"):
        run = make_run(workflow=latest, input={"q": q})
        drive_to_end(run)
        assert run.status == RunStatus.SUCCEEDED

    # The list: the workflow, its latest version and its three runs of today, all succeeded.
    page.goto(f"{site}/runs/")
    page.get_by_role("link", name="Workflows").click()
    page.wait_for_url(f"{site}/workflows/")
    row = page.locator('tr[data-workflow="research"]')
    expect(row.locator('[data-field="runs"]')).to_have_text("3")
    expect(row.locator('[data-field="success_rate"]')).to_contain_text("100%")
    expect(row).to_contain_text("v2")
    row.get_by_role("link", name="research").click()
    page.wait_for_url(f"{site}/workflows/research/")

    # The graph: a box per step, an arrow per need; the three charts; the diff from v1 to v2.
    graph = page.locator("#graph svg")
    expect(graph.locator("g.wfg-step")).to_have_count(4)
    expect(graph.locator("path.wfg-edge")).to_have_count(4)
    expect(graph.locator('g.wfg-step[data-step="write"]')).to_be_visible()
    expect(page.locator("#charts svg.chart")).to_have_count(3)
    expect(page.locator('#charts rect.bar[data-series="succeeded"][data-value="3"]')).to_have_count(1)
    expect(page.locator("#versions .diff-add").first).to_be_visible()
    expect(page.locator("#versions pre.diff")).to_contain_text('"id": "write"')
    screenshot(page, "workflow.png")

    # A bad input: refused by field, the page answers again with what was typed, nothing starts.
    before = Run.objects.count()
    page.fill("textarea[name=input]", '{"q": "no end"')
    page.get_by_role("button", name="Start run").click()
    error = page.locator("#input-error")
    expect(error).to_contain_text("input: not valid JSON")
    expect(page.locator("textarea[name=input]")).to_have_attribute("aria-invalid", "true")
    assert Run.objects.count() == before

    page.fill("textarea[name=input]", '["not", "an object"]')
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#input-error")).to_contain_text("must be a JSON object")
    assert Run.objects.count() == before

    # A good input, sent from the keyboard: the run page of the new run.
    page.fill("textarea[name=input]", '{"q": "from the browser"}')
    page.select_option("select[name=version]", "1")
    page.get_by_role("button", name="Start run").focus()
    page.keyboard.press("Enter")
    page.wait_for_url(f"{site}/runs/*/")
    run = Run.objects.get(input={"q": "from the browser"})
    assert page.url == f"{site}/runs/{run.id}/"
    assert (run.workflow.version, run.created_by) == (1, "olga")

"""The waterfall of a graph in a real browser (headless Chromium through Playwright, against uvicorn on the test
database, as tests/ui/test_browser.py starts them): a diamond whose two middle steps run at the same time and
whose last step is a for_each of 30 items, driven inline to its end. The parallel steps' bars are on rows of their
own, the items are under their step and folded, and a click on the fold shows them all."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive_to_end, make_run, step_events, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ITEMS = 30


def box(locator) -> dict:
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not on the page"
    return found


def test_a_graphs_waterfall_draws_parallel_steps_on_their_own_rows_and_folds_the_items_under_their_step(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    run = make_run(
        steps=[
            tool_step("plan", "echo", {"n": 1}),
            tool_step("web", "sleep", {"seconds": 0.4}, needs=["plan"]),
            tool_step("papers", "sleep", {"seconds": 0.4}, needs=["plan"]),
            tool_step("mail", "echo", {}, needs=["plan"], when="steps.plan.output.n == 2"),
            tool_step("read", "echo", {"i": "{{ index }}"}, needs=["web", "papers"], for_each="{{ input.items }}"),
        ],
        input={"items": list(range(ITEMS))},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    started = {e.step_id: e.seq for e in step_events(run, "step_started")}
    ended = {e.step_id: e.seq for e in step_events(run, "step_completed")}
    assert max(started["web"], started["papers"]) < min(ended["web"], ended["papers"])  # they ran together

    page.goto(f"{site}/runs/{run.id}/")
    waterfall = page.locator("#waterfall")

    def row(step_id: str):
        return waterfall.locator(".wf-row").filter(has=page.locator(f'.wf-label > .mono:text-is("{step_id}")'))

    # The parallel steps: one row each, their bars side by side in time and one above the other.
    web, papers = box(row("web").locator(".wf-bar")), box(row("papers").locator(".wf-bar"))
    assert web["y"] + web["height"] <= papers["y"] or papers["y"] + papers["height"] <= web["y"]
    assert web["x"] < papers["x"] + papers["width"] and papers["x"] < web["x"] + web["width"]
    expect(row("read").locator(".wf-needs")).to_have_text("← web, papers")
    expect(row("mail")).to_have_class("wf-row wf-skipped")
    expect(row("mail").locator(".wf-skip-note")).to_have_text("skipped: steps.plan.output.n == 2 → false")

    # The items: under their step's row, indented, the first five in view and the rest folded.
    expect(row("read")).to_contain_text(f"{ITEMS} items: {ITEMS} done")
    items = waterfall.locator(".wf-row.wf-item")
    expect(items).to_have_count(ITEMS)
    visible = waterfall.locator(".wf-row.wf-item:visible")
    expect(visible).to_have_count(5)
    step_label, first_item = box(row("read").locator(".wf-label > .mono")), box(row("read[0]").locator(".mono"))
    assert first_item["y"] > step_label["y"] and first_item["x"] > step_label["x"]
    fold = waterfall.locator("details.wf-items")
    expect(fold.locator("summary")).to_contain_text(f"show all {ITEMS} items of read")
    expect(row("read[29]")).to_be_hidden()

    fold.locator("summary").click()

    expect(fold).to_have_attribute("open", "")
    expect(visible).to_have_count(ITEMS)
    expect(row("read[29]")).to_be_visible()
    assert box(row("read[29]"))["y"] > box(row("read[4]"))["y"]

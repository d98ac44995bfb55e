"""The move in a real browser (issue 27, section 2; headless Chromium through Playwright against uvicorn, as
tests/ui/test_browser.py starts them): from a parked run's page an operator opens "Move to another version", picks
the new version (htmx swaps the preview in), reads what carries over and what runs again, gives a reason and
moves; the run page shows the new version and the journal's definition_moved row. axe-core finds nothing serious."""

import pytest

from runs.models import RunStatus, Workflow
from runs.services import workflow_create
from tests.helpers import drive, events, make_run, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401
from tests.ui.test_fork import serious_violations

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REVIEW = {"id": "review", "kind": "approval", "prompt": "Send it?"}


def test_an_operator_previews_a_move_to_a_new_version_and_makes_it(page, site):  # noqa: F811
    draft = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    workflow_create(definition={"name": "reply", "steps": [draft, REVIEW]})
    changed = {**draft, "args": {"to": "{{ input.to }}", "tone": "warm"}}
    workflow_create(
        definition={"name": "reply", "description": "warmer", "steps": [changed, REVIEW, tool_step("follow", "echo")]}
    )
    run = make_run(workflow=Workflow.objects.get(name="reply", version=1), input={"to": "ada"})
    drive(run)
    assert run.status == RunStatus.WAITING

    page.goto(f"{site}/runs/{run.id}/")
    page.get_by_role("link", name="Move to another version…").click()
    page.wait_for_url(f"{site}/runs/{run.id}/move/")
    expect(page.locator("#move-preview")).to_contain_text("Choose a version")

    page.select_option("#move-version", "2")  # htmx: the preview alone is swapped in
    preview = page.locator("#move-preview")
    expect(preview).to_contain_text("What a move from v1 to v2 would do")
    expect(preview.locator('tr[data-step="review"]')).to_contain_text("carried over")
    expect(preview.locator('tr[data-step="draft"]')).to_contain_text("runs again")
    expect(preview.locator('tr[data-step="draft"]')).to_contain_text("attempt 2 (a new key)")
    expect(preview.locator('tr[data-step="follow"]')).to_contain_text("new")
    assert "version=2" in page.url  # the preview's address can be shared, and opens without JavaScript
    assert serious_violations(page) == []
    run.refresh_from_db()
    assert run.workflow.version == 1  # a preview moves nothing

    page.fill("#move-reason", "v2 warms the tone")
    page.get_by_role("button", name="Move to version 2").click()

    page.wait_for_url(f"{site}/runs/{run.id}/")
    expect(page.locator("ul.messages")).to_contain_text("Moved run")
    expect(page.locator("#run-header .wf")).to_contain_text("v2")
    expect(page.locator("tr.k-definition_moved").first).to_contain_text("v2 warms the tone")
    run.refresh_from_db()
    assert run.workflow.version == 2
    (moved,) = [e for e in events(run, "definition_moved") if e.step_id is None]
    assert (moved.payload["by"], moved.payload["rerun"], moved.payload["new"]) == ("olga", ["draft"], ["follow"])

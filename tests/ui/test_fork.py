"""The fork page in a real browser (headless Chromium through Playwright, against uvicorn on the test database, as
tests/ui/test_browser.py starts them): from a finished run's page an operator opens the fork form, chooses a step,
edits the input, previews what is reused and what runs, and forks from the keyboard; the new run's page says where
it came from. The preview's screenshot goes to docs/screenshots/fork.png."""

import importlib.resources
import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from tests.helpers import calls, drive_to_end, make_run, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, screenshot, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
AXE = importlib.resources.files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")


def serious_violations(window) -> list[str]:
    """axe-core's serious and critical violations on the page as it stands (as tests/ui/test_accessibility.py),
    but for the status badge, whose colours are the shared stylesheet's (tests/ui/test_accessibility.py checks
    those on every page)."""
    if not window.evaluate("typeof window.axe !== 'undefined'"):
        window.evaluate(AXE)
    found = window.evaluate(
        "async () => (await axe.run({exclude: [['.status']]}, {resultTypes: ['violations']})).violations"
    )
    return [
        f"{v['id']}: {v['help']} on {[n['target'] for n in v['nodes']][:8]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def test_an_operator_previews_a_fork_and_forks_from_the_keyboard(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    original = make_run(
        steps=[
            {"id": "draft", **LLM, "prompt": "Draft a reply to {{ input.ticket }}"},
            tool_step("polish", "test_count", {"text": "{{ steps.draft.output.text }}"}),
            tool_step("send", "test_count", {"to": "{{ input.customer }}"}),
        ],
        input={"ticket": "printer on fire", "customer": "ada"},
    )
    drive_to_end(original)
    assert original.status == RunStatus.SUCCEEDED

    page.goto(f"{site}/runs/{original.id}/")
    page.get_by_role("link", name="Fork from a step…").click()
    page.wait_for_url(f"{site}/runs/{original.id}/fork/")
    assert serious_violations(page) == []

    # Fork from polish with a new customer: draft is reused (it reads only the ticket), polish and send run.
    page.select_option("select[name=from_step]", "polish")
    page.fill("textarea[name=input]", json.dumps({"ticket": "printer on fire", "customer": "grace"}))
    page.fill("input[name=reason]", "send it to the right customer")
    page.get_by_role("button", name="Preview").click()
    preview = page.locator("#fork-preview")
    expect(preview.locator("tr.fork-reused")).to_have_count(1)
    expect(preview.locator("tr.fork-reused")).to_contain_text("draft")
    expect(preview.locator("tr.fork-rerun")).to_have_count(2)
    expect(preview).to_contain_text("reusing is your choice")
    expect(page.locator("textarea[name=input]")).to_have_value(
        json.dumps({"ticket": "printer on fire", "customer": "grace"})
    )
    screenshot(page, "fork.png")
    assert serious_violations(page) == []
    assert Run.objects.count() == 1  # a preview makes nothing

    # The fork, from the keyboard: focus the button and press Enter.
    page.get_by_role("button", name="Fork from polish").focus()
    page.keyboard.press("Enter")
    page.wait_for_url(lambda address: "/fork/" not in address and str(original.id) not in address)
    fork = Run.objects.get(forked_from=original)
    assert page.url == f"{site}/runs/{fork.id}/"
    expect(page.locator("#run-header")).to_contain_text("forked from")
    expect(page.locator(f'#run-header a[href="/runs/{original.id}/"]')).to_be_visible()

    drive_to_end(fork)
    assert fork.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(fork)] == ["polish", "send"]
    assert calls(fork)[1]["args"] == {"to": "grace"}
    reused = JournalEvent.objects.get(run_id=fork.id, step_id="draft", kind="step_completed")
    assert reused.payload["reused_from"]["run_id"] == str(original.id)

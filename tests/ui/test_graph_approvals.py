"""A graph's run waiting on several approvals, in a real browser (headless Chromium through Playwright, against
uvicorn on the test database, as tests/ui/test_browser.py starts them; the run is driven inline): the run page has a
form for each approval and deciding one leaves the run waiting on the other; on /ops/ each item of a for_each over an
approval has its own row, and deciding one row leaves the other's form where it was."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive_to_end, make_run, step_events, tool_step

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_each_pending_approval_of_a_graph_has_its_own_form_and_deciding_one_leaves_the_other(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    run = make_run(
        steps=[
            {"id": "legal", "kind": "approval", "prompt": "Legal says yes?", "needs": []},
            {"id": "money", "kind": "approval", "prompt": "Budget says yes?", "needs": []},
            tool_step("end", "echo", {"done": True}, needs=["legal", "money"]),
        ]
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING

    page.goto(f"{site}/runs/{run.id}/")
    forms = page.locator("#run-actions form.approval")
    expect(forms).to_have_count(2)
    expect(forms.nth(0)).to_contain_text("Legal says yes?")
    expect(forms.nth(1)).to_contain_text("Budget says yes?")

    money = forms.filter(has_text="Budget says yes?")
    money.locator("input[name=comment]").fill("within budget")
    money.locator("button[value='1']").click()

    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Approved step money")
    (decided,) = step_events(run, "approval_decided")
    assert (decided.step_id, decided.payload["comment"]) == ("money", "within budget")
    drive_to_end(run)  # the walk takes the decision and parks again on the other approval
    assert run.status == RunStatus.WAITING

    page.goto(f"{site}/runs/{run.id}/")
    expect(page.locator("body")).to_contain_text("waiting on the approval of step 'legal'")
    expect(forms).to_have_count(1)
    expect(forms).to_contain_text("Legal says yes?")
    forms.locator("button[value='1']").click()

    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Approved step legal")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED and run.output == {"done": True}


def test_on_the_dashboard_each_item_of_a_for_each_approval_has_its_own_row(
    page,  # noqa: F811
    site,  # noqa: F811
):
    run = make_run(
        steps=[{"id": "ship", "kind": "approval", "prompt": "Ship to {{ item }}?", "for_each": "{{ input.to }}"}],
        input={"to": ["Oslo", "Lima"]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING

    page.goto(f"{site}/ops/")
    approvals = page.locator("#approvals")
    expect(approvals.locator(".pill").first).to_have_text("2")
    expect(approvals.locator("form.approval")).to_have_count(2)
    lima = page.locator(f"#approval-{run.id}-ship-I1")
    expect(lima).to_contain_text("Ship to Lima?")
    lima.locator("input[name=comment]").fill("wrong address")
    lima.locator("button[value='0']").click()

    expect(page.locator(f"#approval-{run.id}-ship-I1")).to_contain_text("Rejected step ship[1]")
    oslo = page.locator(f"#approval-{run.id}")
    expect(oslo.locator("form.approval")).to_contain_text("Ship to Oslo?")  # the other row keeps its form
    (decided,) = step_events(run, "approval_decided")
    assert (decided.step_id, decided.payload["approved"]) == ("ship[1]", False)

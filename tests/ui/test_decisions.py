"""People in the loop in a real browser (issue 28; headless Chromium through Playwright against uvicorn on the test
database, as tests/ui/test_browser.py starts them; runs are driven inline): an operator decides from /inbox/ with a
reason, from the keyboard, and the row answers in place while the list keeps refreshing itself; a typed approval's
form is filled and its answer becomes the step's output; a notification's signed link decides without a login,
once; axe-core finds no serious or critical violation on the inbox, a typed form or the link's page."""

import json

import pytest

from runs.models import RunStatus
from tests.helpers import drive, drive_to_end, make_run, step_events
from tests.ui.test_accessibility import Audit, tab_to

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

FORM = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "minimum": 0, "maximum": 500, "title": "Amount (USD)"},
        "reason": {"type": "string", "enum": ["damaged", "late"], "title": "Why"},
        "notify_customer": {"type": "boolean", "title": "Tell the customer"},
    },
    "required": ["amount", "reason"],
}


def waiting(prompt: str, **fields):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": prompt, **fields}])
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def test_an_operator_decides_from_the_inbox_with_a_reason_from_the_keyboard(page, site):  # noqa: F811
    first = waiting("Ship order 1?")
    second = waiting("Ship order 2?", choices=["ship", "hold"])

    page.goto(f"{site}/inbox/")
    rows = page.locator("#inbox-list article.decision-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("Ship order 1?")  # oldest first
    page.evaluate("window.samePage = true")

    row = page.locator(f"#inbox-{second.id}-review")
    tab_to(page, f"#inbox-{second.id}-review input[name=comment]")
    page.keyboard.type("customer asked to wait")
    tab_to(page, f"#inbox-{second.id}-review button[value=hold]")
    page.keyboard.press("Enter")

    expect(row).to_contain_text("Chose 'hold' for step review")
    expect(row).to_contain_text("is now running")
    (decided,) = step_events(second, "approval_decided", "review")
    assert (decided.payload["choice"], decided.payload["by"], decided.payload["comment"]) == (
        "hold",
        "olga",
        "customer asked to wait",
    )

    # The list refreshes itself (pal.js, every 5 s while nobody types in it): a decision opened meanwhile appears
    # and the decided one is gone, without a reload.
    third = waiting("Ship order 3?")
    expect(page.locator(f"#inbox-{third.id}-review")).to_be_visible(timeout=15_000)
    expect(page.locator(f"#inbox-{second.id}-review")).to_have_count(0)
    assert page.evaluate("window.samePage") is True

    reject = page.locator(f"#inbox-{first.id}-review")
    reject.locator("input[name=comment]").fill("address unknown")
    reject.get_by_role("button", name="Reject").click()
    expect(reject).to_contain_text("Rejected step review")
    drive_to_end(first)
    assert first.status == RunStatus.FAILED and first.error["code"] == "approval_rejected"


def test_a_typed_form_is_filled_on_the_run_page_and_its_answer_is_the_output(page, site):  # noqa: F811
    run = make_run(
        steps=[
            {"id": "review", "kind": "approval", "prompt": "Refund order 7?", "form": FORM},
            {"id": "after", "kind": "tool_call", "tool": "echo", "args": {"got": "{{ steps.review.output }}"}},
        ]
    )
    drive(run)

    page.goto(f"{site}/runs/{run.id}/")
    form = page.locator("#run-actions form.approval")
    form.get_by_label("Amount (USD)").fill("900")
    form.get_by_label("Why").select_option("late")
    form.get_by_label("Tell the customer").check()
    form.get_by_role("button", name="Approve").click()
    # The browser holds an amount past its maximum back: nothing was sent.
    assert page.evaluate("document.querySelector('#run-actions input[name=\"answer.amount\"]').validity.valid") is False
    assert step_events(run, "approval_decided") == []

    form.get_by_label("Amount (USD)").fill("40.5")
    form.get_by_role("button", name="Approve").click()
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Approved step review")

    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"got": {"amount": 40.5, "reason": "late", "notify_customer": True}}


def test_a_signed_link_decides_without_a_login_once(browser, site, webhook_receiver, settings):  # noqa: F811
    settings.PAL_SITE_URL = site
    run = waiting("Refund 7?", notify={"webhook": webhook_receiver.url}, link_decides=True, choices=["refund", "hold"])
    url = json.loads(webhook_receiver.deliveries[0].body)["url"]
    assert url.startswith(f"{site}/decisions/")
    context = browser.new_context()  # no login
    window = context.new_page()
    window.on("dialog", lambda dialog: dialog.accept())
    try:
        window.goto(url)
        expect(window.locator("main")).to_contain_text("Refund 7?")
        window.get_by_role("button", name="refund").click()
        expect(window.locator("main")).to_contain_text("Decision recorded")
        assert step_events(run, "approval_decided")[0].payload["choice"] == "refund"

        answer = window.goto(url)
        assert answer.status == 410
        expect(window.locator("main")).to_contain_text("used already")
    finally:
        context.close()


def test_the_inbox_a_typed_form_and_the_links_page_have_no_serious_accessibility_violation(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
    webhook_receiver,
    settings,
):
    settings.PAL_SITE_URL = site
    waiting("Refund order 7?", form=FORM, choices=["refund", "hold"], assign={"group": "billing"})
    linked = waiting("Ship it?", notify={"webhook": webhook_receiver.url}, link_decides=True, form=FORM)
    audit = Audit(page)
    audit.visit(f"{site}/inbox/", "the inbox with a typed and an assigned approval")
    expect(page.locator("#inbox-list article.decision-row")).to_have_count(2)
    audit.visit(f"{site}/runs/{linked.id}/", "a run page with a typed approval")
    audit.visit(json.loads(webhook_receiver.deliveries[0].body)["url"], "a signed link's page")
    expect(page.locator("main")).to_contain_text("Ship it?")
    audit.visit(f"{site}/ops/", "the ops dashboard with its decision counts")
    audit.assert_clean()

"""Attributes and saved views in a real browser (issue 27 section 4): Debian's Chromium through Playwright against
uvicorn on the test database, as tests/ui/test_browser.py starts them. An operator filters /runs/ by an attribute,
saves the filter as a view, and opens it again from the list of views with its count; axe-core finds no serious or
critical violation on the page with a view open."""

import re

import pytest

from runs.models import SavedView
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run
from tests.ui.test_accessibility import Audit

# The browser, the server and the logged-in window of the browser tests.
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_operator_saves_an_attribute_filter_as_a_view_and_opens_it(page, site):  # noqa: F811
    steps = [echo_step("classify", tier="{{ input.plan }}")]
    attributes = {"customer": "{{ input.customer }}", "tier": "{{ steps.classify.output.tier }}"}
    workflow = workflow_create(definition={"name": "billing", "steps": steps, "attributes": attributes})
    acme = [make_run(workflow=workflow, input={"customer": "acme", "plan": "gold"}) for _ in range(2)]
    drive_to_end(acme[0])
    make_run(workflow=workflow, input={"customer": "globex", "plan": "free"})

    page.goto(f"{site}/runs/")
    expect(page.locator("tr.run-row")).to_have_count(3)
    page.get_by_label("Attribute", exact=True).fill("customer")
    page.get_by_label("is", exact=True).fill("acme")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tr.run-row")).to_have_count(2)
    expect(page.locator("#attribute-filters")).to_contain_text("customer = acme")
    expect(page.locator(f'tr[data-run="{acme[0].id}"] td.attributes')).to_contain_text("tier gold")

    page.get_by_label("Save this filter as").fill("acme's runs")
    page.get_by_role("button", name="Save view").click()
    expect(page.locator("ul.messages")).to_contain_text('Saved the view "acme\'s runs"')
    expect(page.locator("h1")).to_contain_text("Runs: acme's runs")
    view = SavedView.objects.get()
    assert view.filter == {"attr.customer": "acme"} and view.owner.username == "olga"
    audit = Audit(page)
    audit.scan("/runs/ with a saved view open")

    page.goto(f"{site}/runs/")
    expect(page.locator("tr.run-row")).to_have_count(3)
    views = page.locator("#saved-views")
    expect(views).to_contain_text("acme's runs 2")  # the counts come in once the page has loaded
    views.get_by_role("link", name="acme's runs").click()
    expect(page).to_have_url(re.compile(rf"/runs/\?view={view.id}$"))
    expect(page.locator("tr.run-row")).to_have_count(2)
    expect(page.locator("main")).to_contain_text("Saved view by olga")
    expect(views.locator('a[aria-current="page"] + .count')).to_have_text("2")
    audit.scan("/runs/ opened from the list of views")
    audit.assert_clean()

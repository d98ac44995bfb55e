"""A refusal says so (issue 24, section 3), in Chromium: an operator whose permission was taken away while the
run page was open presses Cancel; the page shows why (the flash bar, from the 403 htmx does not swap) and nothing
changes. The same post without JavaScript answers the 403 page with the reason."""

import pytest
from django.contrib.auth.models import Permission, User

from runs.models import Run, RunStatus
from tests.helpers import drive, echo_step, make_run

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REFUSED = "this action needs the operator permission (runs.operate)"


def test_an_action_refused_after_the_permission_went_says_why_and_changes_nothing(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    run = make_run(steps=[echo_step("build"), {"id": "ci", "kind": "signal", "name": "ci-done"}])
    drive(run)
    assert run.status == RunStatus.WAITING
    page.goto(f"{site}/runs/{run.id}/")
    page.fill("#run-actions input[name=reason]", "the release was called off")
    olga = User.objects.get(username="olga")
    olga.user_permissions.remove(Permission.objects.get(codename="operate"))  # an admin took it away meanwhile

    page.click("#run-actions button:has-text('Cancel the run')")

    expect(page.locator("#flash")).to_be_visible()
    expect(page.locator("#flash")).to_contain_text(REFUSED)
    assert Run.objects.get(id=run.id).status == RunStatus.WAITING

    # Without JavaScript the form posts itself: the answer is the refusal's page, 403, saying the same.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    answer = page.request.post(
        f"{site}/runs/{run.id}/cancel/",
        form={"reason": "once more", "csrfmiddlewaretoken": token},
        headers={"Referer": f"{site}/runs/{run.id}/"},
    )
    assert answer.status == 403
    assert REFUSED in answer.text() and "403 · Refused" in answer.text()
    assert Run.objects.get(id=run.id).status == RunStatus.WAITING

"""The Content-Security-Policy: every page (ours, the admin's, the API docs) comes with it and loads in Chromium with
nothing refused, and the page still works (htmx swaps, the live journal, the waterfall's places). The `page`
fixture fails any UI test on a refusal; here every kind of page is visited on purpose, and a page that breaks the
policy is shown to be refused, so the watch is known to see."""

import pytest

from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, tool_step
from tests.pages.conftest import make_user
from tests.ui.test_accessibility import a_run_of_each_status
from tests.ui.test_browser import PASSWORD, WAIT, _orm_beside_playwright, browser, csp_violations, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

POLICY = {
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "object-src 'none'",
    "frame-ancestors 'none'",
    "form-action 'self'",
}


def directives(header: str) -> set[str]:
    return {part.strip() for part in header.split(";") if part.strip()}


def visit(window, url: str, seen: list) -> None:
    answer = window.goto(url)
    assert answer is not None and answer.status < 400, f"{url}: {answer and answer.status}"
    header = answer.headers.get("content-security-policy", "")
    assert POLICY <= directives(header), f"{url} came with {header!r}"
    window.wait_for_load_state("load")
    seen.append(url)


def test_every_page_comes_with_the_policy_and_loads_with_nothing_refused(page, site):  # noqa: F811
    runs = a_run_of_each_status()
    workflow_create(definition={"name": "graph", "steps": [echo_step("a"), {**echo_step("b"), "needs": ["a"]}]})
    failed = runs["failed"].workflow.name  # a version 2 of it, to preview a move there
    workflow_create(definition={"name": failed, "steps": [echo_step("a"), tool_step("boom", "echo")]})
    done = runs["succeeded"]
    seen: list[str] = []
    for url in [
        "/runs/",
        "/ops/",
        "/inbox/",
        "/workflows/",
        "/workflows/graph/",
        "/schedules/",
        "/reruns/?from_step=failed&preview=1",
        f"/runs/compare/?a={done.id}&b={runs['failed'].id}",
        *(f"/runs/{run.id}/" for run in runs.values()),
        *(f"/runs/{done.id}/{path}" for path in ("receipt/", "waterfall/", "redrive/", "steps/think/", "fork/")),
        f"/runs/{runs['failed'].id}/move/?version=2",
        "/api/v1/docs",
    ]:
        visit(page, f"{site}{url}", seen)
    # The step panel (a script that loads its own stylesheet) and a nested child waterfall (an htmx swap).
    page.goto(f"{site}/runs/{done.id}/#step-think")
    page.wait_for_selector("#step-panel:not([hidden])")
    page.goto(f"{site}/runs/{runs['parent'].id}/")
    page.click("#waterfall details.wf-child summary")
    page.wait_for_selector("#waterfall .wf-nested .wf-row")
    # The API docs' Swagger UI draws itself from our own static files.
    page.goto(f"{site}/api/v1/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=WAIT)
    assert len(seen) == 23  # the page fixture then fails the test on any refusal seen in these windows


def test_the_waterfall_places_its_bars_from_their_data_attributes(page, site):  # noqa: F811
    run = make_run(steps=[echo_step("a"), tool_step("slow", "sleep", {"seconds": 0.3}), echo_step("c")])
    drive_to_end(run)
    page.goto(f"{site}/runs/{run.id}/")
    bars = page.locator("#waterfall .wf-row .wf-bar")
    expect(bars.first).to_be_visible()
    placed = page.evaluate(
        """() => [...document.querySelectorAll('#waterfall .wf-bar')].map(bar => {
             const track = bar.closest('.wf-track').getBoundingClientRect(), box = bar.getBoundingClientRect();
             return {l: +bar.dataset.l, w: +bar.dataset.w, left: 100 * (box.left - track.left) / track.width,
                     width: 100 * box.width / track.width};
           })"""
    )
    assert len(placed) == 3
    for bar in placed:  # where the data says, to half a percent (a bar under 1 % keeps its min-width)
        assert abs(bar["left"] - bar["l"]) < 0.5, bar
        if bar["w"] >= 1:
            assert abs(bar["width"] - bar["w"]) < 0.5, bar
    slow = max(placed, key=lambda bar: bar["w"])
    assert slow["w"] > 50  # the sleeping step takes most of the run


def test_a_page_that_breaks_the_policy_is_refused_and_seen(browser, site, transactional_db):  # noqa: F811
    """The watch itself: an inline script put into a page is refused, and Chromium says so on the console."""
    user = make_user("vera", "runs.view_run")
    user.set_password(PASSWORD)
    user.save()
    context = browser.new_context()
    window = context.new_page()
    messages = []
    window.on("console", lambda message: messages.append(message))
    window.goto(f"{site}/accounts/login/")
    window.evaluate(
        """() => { const s = document.createElement('script'); s.textContent = 'window.ran = 1';
                   document.body.appendChild(s); }"""
    )
    window.wait_for_timeout(200)
    assert window.evaluate("window.ran === undefined")
    assert csp_violations(messages), [m.text for m in messages]
    context.close()


def test_the_admin_comes_with_the_policy_and_loads_with_nothing_refused(browser, site, transactional_db):  # noqa: F811
    admin = make_user("root", superuser=True)
    admin.is_staff = True
    admin.set_password(PASSWORD)
    admin.save()
    context = browser.new_context()
    window = context.new_page()
    messages = []
    window.on("console", lambda message: messages.append(message))
    window.goto(f"{site}/admin/login/")
    window.fill("input[name=username]", "root")
    window.fill("input[name=password]", PASSWORD)
    window.click("input[type=submit]")
    window.wait_for_url(f"{site}/admin/")
    make_run(steps=[echo_step("a")])
    seen: list[str] = []
    for url in [
        "/admin/",
        "/admin/runs/run/",
        "/admin/runs/workflow/",
        "/admin/tokens/apitoken/",
        "/admin/auth/user/add/",
    ]:
        visit(window, f"{site}{url}", seen)
    window.goto(f"{site}/admin/runs/run/")
    window.click("#result_list tbody tr a")  # a run's change page
    window.wait_for_load_state("load")
    context.close()
    assert csp_violations(messages) == []

"""Pages everyone can use: axe-core (the engine behind the browsers' accessibility audits) over every page of ours
in a real browser (Debian's Chromium through Playwright, against uvicorn on the test database, as
tests/ui/test_browser.py starts them), each page with the data that makes it show its badges, forms and notices.
No page may have a serious or critical violation. And every action works from the keyboard: the focus is always
visible, the bulk form and an approval are done with Tab, Space and Enter alone.

axe.min.js comes from the axe-playwright-python package (requirements-dev.txt pins it; it bundles axe-core 4.12.1, the
axe-core npm package's build with its MPL-2.0 notice): read from the installed package and evaluated in the page,
no CDN and no npm at test time."""

import importlib.resources

import pytest
from axes.models import AccessAttempt
from django.utils import timezone

from runs.models import BulkAction, Run, RunLock, RunStatus, SideEffect, SideEffectStatus
from runs.schedules import schedule_create, schedule_pause
from runs.services import bulk_apply, run_cancel, workflow_create
from tests.code import sample_workflows
from tests.helpers import (
    CRASHING_MAIL,
    LOCMEM_MAIL,
    Crash,
    drive,
    drive_to_end,
    echo_step,
    mailer,
    make_run,
    make_workflow,
    step_events,
    sweep_after_expiry,
    tool_step,
)

# The browser, the server and the logged-in window of the browser tests (module fixtures: one of each here too).
from tests.pages.conftest import make_user
from tests.ui.test_browser import PASSWORD, _orm_beside_playwright, browser, expect, page, site  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

AXE = importlib.resources.files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")
BLOCKING = {"serious", "critical"}
LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}


def axe_violations(window) -> list[dict]:
    """axe-core's violations on the page as it stands (every rule axe runs by default: WCAG 2.x A and AA and
    best practices). Evaluated through the DevTools protocol, so no Content-Security-Policy stands in the way."""
    if not window.evaluate("typeof window.axe !== 'undefined'"):
        window.evaluate(AXE)
    return window.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")


def described(violations: list[dict]) -> str:
    lines = []
    for violation in violations:
        targets = ", ".join(" ".join(node["target"]) for node in violation["nodes"][:8])
        more = f" (+{len(violation['nodes']) - 8} more)" if len(violation["nodes"]) > 8 else ""
        lines.append(f"{violation['id']} [{violation['impact']}] on {targets}{more}: {violation['help']}")
    return "\n".join(lines)


class Audit:
    """Scans pages one after another and tells, at the end, every serious or critical violation of them all."""

    def __init__(self, window):
        self.window = window
        self.found: list[str] = []
        self.scanned = 0

    def scan(self, what: str) -> None:
        violations = axe_violations(self.window)
        self.scanned += 1
        blocking = [v for v in violations if v["impact"] in BLOCKING]
        if lesser := [v for v in violations if v["impact"] not in BLOCKING]:  # shown with -s, or on a failure
            print(f"axe-core, moderate or minor, on {what}:\n{described(lesser)}")
        if blocking:
            self.found.append(f"{what} ({self.window.url}):\n{described(blocking)}")

    def visit(self, url: str, what: str) -> None:
        self.window.goto(url)
        self.scan(what)

    def assert_clean(self) -> None:
        assert self.scanned, "no page was scanned"
        assert self.found == [], "axe-core found serious or critical violations on\n" + "\n".join(self.found)


# --- the keyboard ---------------------------------------------------------------------------------

FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const style = getComputedStyle(el);
  const ring = (style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0) || style.boxShadow !== "none";
  const name = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + (el.name ? `[name=${el.name}]` : "")
    + (el.textContent.trim() ? ` "${el.textContent.trim().slice(0, 30)}"` : "");
  return {ring, name};
}"""


def tab_to(window, selector: str, *, limit: int = 200) -> None:
    """Press Tab until the keyboard focus is on `selector`, as a keyboard user would get there; every element
    the focus passes on the way must show a focus ring."""
    unseen = []
    for _ in range(limit):
        window.keyboard.press("Tab")
        focused = window.evaluate(FOCUSED)
        if focused and not focused["ring"]:
            unseen.append(focused["name"])
        if window.evaluate("s => document.activeElement?.matches(s) ?? false", selector):
            assert unseen == [], f"the focus was not visible on {unseen}"
            return
    raise AssertionError(f"Tab never reached {selector} in {limit} presses (last: {window.evaluate(FOCUSED)})")


def next_refresh(window, target: str) -> None:
    """Wait for the next htmx swap of `target` (a fragment that refreshes itself every few seconds)."""
    window.evaluate(
        """id => new Promise(done => document.body.addEventListener("htmx:afterSettle", function settled(event) {
             if (event.detail.target.id !== id) return;
             document.body.removeEventListener("htmx:afterSettle", settled);
             done();
           }))""",
        target,
    )


# --- data that makes each page show what it can ---------------------------------------------------


def a_run_of_each_status() -> dict[str, Run]:
    """A run of each status, each with what its page then shows: a model call's receipt, a failed step to retry,
    a pending approval, a signal waited on, a child run nested in its parent's waterfall, a dead worker's lease."""
    runs = {}
    runs["succeeded"] = make_run(
        steps=[echo_step("a"), {"id": "think", **LLM, "prompt": "Say hi"}], input={"customer": "acme"}
    )
    drive_to_end(runs["succeeded"])
    runs["failed"] = make_run(steps=[echo_step("a"), tool_step("boom", "test_fail")])
    drive_to_end(runs["failed"])
    runs["waiting"] = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Refund 40 EUR?"}])
    drive(runs["waiting"])
    runs["waiting on a signal"] = make_run(steps=[echo_step("build"), {"id": "ci", "kind": "signal", "name": "ci"}])
    drive(runs["waiting on a signal"])
    child = make_workflow(name="child", steps=[echo_step("inner")])
    runs["parent"] = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": child.name, "input": {}}])
    drive(runs["parent"])
    runs["cancelled"] = make_run(steps=[echo_step("a")])
    run_cancel(run_id=runs["cancelled"].id, by="olga", reason="not needed")
    runs["queued"] = make_run(steps=[echo_step("a")])
    runs["running"] = make_run(steps=[echo_step("a")])
    Run.objects.filter(id=runs["running"].id).update(status=RunStatus.RUNNING)
    RunLock.objects.filter(run_id=runs["running"].id).update(owner="worker-3:4242:9f1c", expires_at=timezone.now())
    return runs


def an_unconfirmed_email(settings) -> SideEffect:
    """An email the worker died while sending: the ops dashboard asks an operator what became of it."""
    settings.MAILERS = mailer(CRASHING_MAIL)
    mail = {"id": "mail", "kind": "deliver", "channel": "email", "to": ["ops@example.com"], "subject": "Hi"}
    mailed = make_run(steps=[echo_step("greet"), {**mail, "body": "Hello"}])
    with pytest.raises(Crash):
        drive(mailed)
    settings.MAILERS = mailer(LOCMEM_MAIL)
    sweep_after_expiry(mailed)
    drive_to_end(mailed)
    effect = SideEffect.objects.get(run=mailed)
    assert effect.status == SideEffectStatus.UNCONFIRMED
    return effect


# --- every page, scanned --------------------------------------------------------------------------


def test_the_run_list_and_a_bulk_action_have_no_serious_accessibility_violation(
    page,  # noqa: F811 (the fixtures imported above)
    site,  # noqa: F811
):
    runs = a_run_of_each_status()
    audit = Audit(page)
    audit.visit(f"{site}/runs/", "the run list")
    audit.visit(f"{site}/runs/?status=failed&input=%7B%22customer%22", "the run list with a refused filter")
    page.goto(f"{site}/runs/")
    page.check(f'input[name=ids][value="{runs["failed"].id}"]')
    page.select_option("#bulk-form select[name=action]", "retry")
    page.fill("#bulk-form input[name=reason]", "flaky")
    page.click("#bulk-form button[type=submit]")
    expect(page.locator("#bulk-preview")).to_contain_text("Retry 1 run")
    audit.scan("the run list with a bulk preview")
    page.click("#bulk-preview button[type=submit]")
    page.wait_for_selector("#bulk-progress")
    bulk_apply(bulk_id=BulkAction.objects.get().id)  # the background task's body, here: no worker runs
    audit.scan("the run list with a bulk action's progress")
    audit.visit(f"{site}/runs/bulk/{BulkAction.objects.get().id}/", "a bulk action's page")
    audit.assert_clean()


def test_the_run_pages_have_no_serious_accessibility_violation(page, site):  # noqa: F811
    runs = a_run_of_each_status()
    audit = Audit(page)
    for status, run in runs.items():
        audit.visit(f"{site}/runs/{run.id}/", f"a {status} run's page")
    page.goto(f"{site}/runs/{runs['parent'].id}/")
    page.click("#waterfall details.wf-child summary")  # the child's waterfall, nested in its parent's
    page.wait_for_selector("#waterfall .wf-nested .wf-row")
    audit.scan("a parent run's page with its child's waterfall open")
    page.goto(f"{site}/runs/{runs['running'].id}/")
    page.click("#redrive-panel summary")
    page.wait_for_selector("#redrive")
    audit.scan("a run's page with the re-drive preview open")
    done = runs["succeeded"]
    for path in ("receipt/", "waterfall/", "redrive/", "steps/think/", "fork/"):
        audit.visit(f"{site}/runs/{done.id}/{path}", f"/runs/<id>/{path}")
    page.get_by_role("button", name="Preview").click()
    page.wait_for_selector("#fork-preview")
    audit.scan("the fork form with its preview")
    page.goto(f"{site}/runs/{done.id}/#step-think")
    page.wait_for_selector("#step-panel:not([hidden])")
    audit.scan("a run page with its step panel open")
    audit.assert_clean()


def test_the_ops_dashboard_has_no_serious_accessibility_violation(page, site, settings):  # noqa: F811
    a_run_of_each_status()
    an_unconfirmed_email(settings)
    audit = Audit(page)
    audit.visit(f"{site}/ops/", "the ops dashboard")
    audit.assert_clean()


def test_the_workflow_and_compare_pages_have_no_serious_accessibility_violation(page, site):  # noqa: F811
    workflow_create(definition={"name": "research", "steps": [echo_step("plan")]})
    latest = workflow_create(
        definition={"name": "research", "steps": [echo_step("plan"), {"id": "write", **LLM, "prompt": "Write"}]}
    )
    a, b = make_run(workflow=latest, input={"q": "a"}), make_run(workflow=latest, input={"q": "b"})
    drive_to_end(a)
    drive_to_end(b)
    audit = Audit(page)
    audit.visit(f"{site}/workflows/", "the workflow list")
    audit.visit(f"{site}/workflows/research/", "a workflow's page")
    page.fill("textarea[name=input]", '{"q": ')
    page.get_by_role("button", name="Start run").click()
    page.wait_for_selector("#input-error")
    audit.scan("a workflow's page with a refused input")
    # A graph wider than the page scrolls: its region must be reachable from the keyboard (scrollable-region-
    # focusable, serious).
    wide = [echo_step(f"step-{n}") for n in range(40)]  # a chain of 40, drawn left to right
    workflow_create(definition={"name": "wide", "steps": wide})
    audit.visit(f"{site}/workflows/wide/", "a workflow whose graph scrolls")
    scrolls = page.evaluate(
        "() => { const g = document.querySelector('.graph-scroll'); return g.scrollWidth > g.clientWidth; }"
    )
    assert scrolls, "the wide graph was meant to scroll"
    # A Python workflow: its steps are what its runs took, its source by version in <details>.
    python_run = Run.objects.get(id=sample_workflows.py_sum.start({"xs": [1, 2]}))
    drive_to_end(python_run)
    audit.visit(f"{site}/workflows/py-sum/", "a Python workflow's page")
    audit.visit(f"{site}/runs/compare/", "the compare form")
    audit.visit(f"{site}/runs/compare/?a={a.id}&b={b.id}", "two runs compared")
    audit.visit(f"{site}/runs/compare/?a=nope&b={b.id}", "a refused comparison")
    audit.assert_clean()


def test_the_schedules_page_has_no_serious_accessibility_violation(page, site):  # noqa: F811
    workflow_create(definition={"name": "nightly", "steps": [echo_step("report")]})
    schedule_create(workflow="nightly", cron="0 3 * * *", by="olga", reason="the nightly report")
    paused = schedule_create(workflow="nightly", cron="*/15 * * * *", timezone_name="Europe/Paris", by="olga")
    schedule_pause(schedule_id=paused.id, by="olga", reason="holidays")
    audit = Audit(page)
    audit.visit(f"{site}/schedules/", "the schedules page")
    expect(page.locator("main")).to_contain_text("*/15 * * * *")
    audit.assert_clean()


def test_the_login_page_has_no_serious_accessibility_violation(browser, site):  # noqa: F811
    context = browser.new_context()
    window = context.new_page()
    audit = Audit(window)
    audit.visit(f"{site}/accounts/login/", "the login page")
    window.fill("input[name=username]", "nobody")
    window.fill("input[name=password]", "wrong")
    window.click("button[type=submit]")
    expect(window.locator("main")).to_contain_text("did not match")
    audit.scan("the login page after a wrong password")
    try:
        for _ in range(6):  # past PAL_LOGIN_FAILURE_LIMIT (5): the lockout page
            window.goto(f"{site}/accounts/login/")
            window.fill("input[name=username]", "nobody")
            window.fill("input[name=password]", "wrong")
            window.click("button[type=submit]")
        expect(window.locator("main")).to_contain_text("Too many failed logins")
        audit.scan("the lockout page")
    finally:
        AccessAttempt.objects.all().delete()  # this address may log in again for the tests after this one
    context.close()
    audit.assert_clean()


def test_the_refusal_page_has_no_serious_accessibility_violation(browser, site):  # noqa: F811
    user = make_user("nils")  # logged in, neither role
    user.set_password(PASSWORD)
    user.save()
    context = browser.new_context()
    window = context.new_page()
    window.goto(f"{site}/accounts/login/")
    window.fill("input[name=username]", "nils")
    window.fill("input[name=password]", PASSWORD)
    window.click("button[type=submit]")
    audit = Audit(window)
    answer = window.goto(f"{site}/runs/")
    assert answer is not None and answer.status == 403
    expect(window.locator("body")).to_contain_text("runs.view_run")
    audit.scan("the 403 page")
    context.close()
    audit.assert_clean()


# --- every action from the keyboard ---------------------------------------------------------------


def test_a_bulk_retry_is_done_from_the_keyboard_alone_with_the_focus_always_visible(page, site):  # noqa: F811
    runs = a_run_of_each_status()
    failed = runs["failed"]
    page.goto(f"{site}/runs/")
    tick = f'input[name=ids][value="{failed.id}"]'
    tab_to(page, tick)
    next_refresh(page, "run-rows")  # the rows refresh every few seconds: the focus stays on the box
    assert page.evaluate("s => document.activeElement.matches(s)", tick)
    page.keyboard.press("Space")
    expect(page.locator(tick)).to_be_checked()

    tab_to(page, "#bulk-form select[name=action]")
    for _ in range(5):
        if page.input_value("#bulk-form select[name=action]") == "retry":
            break
        page.keyboard.press("ArrowDown")
    assert page.input_value("#bulk-form select[name=action]") == "retry"
    tab_to(page, "#bulk-form input[name=reason]")
    page.keyboard.type("flaky upstream")
    page.keyboard.press("Enter")  # the form's own submission: the preview
    expect(page.locator("#bulk-preview")).to_contain_text("Retry 1 run")
    tab_to(page, "#bulk-preview button[type=submit]")
    page.keyboard.press("Enter")  # the confirmation dialog is accepted by the window
    page.wait_for_selector("#bulk-progress")
    bulk = BulkAction.objects.get()
    assert (bulk.action, bulk.run_ids, bulk.reason) == ("retry", [str(failed.id)], "flaky upstream")
    assert bulk.created_by == "olga"


def test_an_approval_and_the_step_panel_work_from_the_keyboard_with_the_focus_always_visible(page, site):  # noqa: F811
    runs = a_run_of_each_status()
    waiting = runs["waiting"]
    page.goto(f"{site}/runs/{waiting.id}/")
    tab_to(page, "#run-actions form.approval input[name=comment]")
    page.keyboard.type("refund is due")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent.trim()") == "Approve"
    page.keyboard.press("Enter")
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Approved step review")
    decided = step_events(waiting, "approval_decided")[0].payload
    assert (decided["approved"], decided["by"], decided["comment"]) == (True, "olga", "refund is due")

    # A waterfall bar is a button too: Enter opens its step's panel, which takes the focus.
    page.goto(f"{site}/runs/{runs['succeeded'].id}/")
    tab_to(page, '#waterfall .wf-bar[data-step-panel="think"]')
    page.keyboard.press("Enter")
    expect(page.locator("#step-panel")).to_be_visible()
    expect(page.locator("#step-panel")).to_contain_text("think")
    # The panel takes the focus once htmx has settled its content (a moment later on a busy machine).
    page.wait_for_function("() => document.getElementById('step-panel').contains(document.activeElement)")

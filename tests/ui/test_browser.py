"""The operator's pages in a real browser: headless Chromium (Debian's, through Playwright) against a real uvicorn
serving pal.asgi and real Celery workers, on the test database. An operator logs in, watches a run move live in
the journal and the waterfall, approves it, re-drives a run whose worker was killed, cancels a run, and settles
what the ops dashboard shows. Screenshots of the run page and the dashboard go to docs/screenshots/."""

import time

import pytest
from django.utils import timezone

from runs.models import Run, RunLock, RunStatus, SideEffect, SideEffectStatus
from runs.services import run_create
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
from tests.pages.conftest import make_user
from tests.support import workers as worker_support
from tests.support.web import uvicorn_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it); Playwright never downloads a browser
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = worker_support.REPO_ROOT / "docs" / "screenshots"
PASSWORD = "correct horse battery staple"
WAIT = 30_000  # ms: how long a live change may take to show (a worker's walk, the stream, a throttled refresh)

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright():
    """Playwright's sync API keeps an asyncio loop on this thread for as long as the browser is open; the test's
    own ORM calls (and pytest-django's flush after each test) are still plain synchronous code between browser
    steps, which Django's guard cannot tell apart. For this module only, set before and cleared after it all."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tmp_path_factory):
    """uvicorn serving pal.asgi on the test database for the whole module: the pages, the session-auth stream."""
    with django_db_blocker.unblock():
        database = worker_support.database_url()
    env = {
        "PAL_LEASE_TTL": "2",
        "PAL_RECOVERY_INTERVAL": "1",
        "PAL_STREAM_POLL_INTERVAL": "0.2",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    }
    with uvicorn_server(
        database_url=database, env=env, log_dir=tmp_path_factory.mktemp("uvicorn"), ready_path="/accounts/login/"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, site, transactional_db):
    """A fresh browser window logged in as an operator through the login form; confirmations are accepted.
    Fails the test on a JavaScript error, a server error answer or anything the Content-Security-Policy refused."""
    user = make_user("olga", "runs.view_run", "runs.operate")
    user.set_password(PASSWORD)
    user.save()
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    window = context.new_page()
    window.set_default_timeout(WAIT)
    problems = []
    window.on("pageerror", lambda error: problems.append(f"JavaScript error: {error}"))
    window.on("console", lambda message: problems.extend(csp_violations([message])))
    window.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    window.on("dialog", lambda dialog: dialog.accept())
    window.goto(f"{site}/runs/")
    assert "/accounts/login/" in window.url  # every page needs a login
    window.fill("input[name=username]", "olga")
    window.fill("input[name=password]", PASSWORD)
    window.click("button[type=submit]")
    window.wait_for_url(f"{site}/runs/")
    yield window
    context.close()
    assert problems == []


def csp_violations(messages) -> list[str]:
    """The console messages among these in which Chromium says the Content-Security-Policy refused something."""
    return [f"CSP: {m.text}" for m in messages if "Content Security Policy" in m.text]


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def wait_until(condition, *, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def screenshot(window, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    window.screenshot(path=str(SCREENSHOTS / name), full_page=True)


# --- the run page ---------------------------------------------------------------------------------


def test_an_operator_watches_a_run_move_live_and_approves_it(page, site, celery_workers):
    make_workflow(
        name="research",
        steps=[
            tool_step("search", "sleep", {"seconds": 0.5}),
            {"id": "summarise", **LLM, "prompt": "Summarise {{ input.q }}"},
        ],
    )
    make_workflow(
        name="incident-reply",
        steps=[
            {"id": "draft", **LLM, "prompt": "Draft a reply to: {{ input.ticket }}"},
            {"id": "research", "kind": "child_run", "workflow": "research", "input": {"q": "{{ input.ticket }}"}},
            tool_step("lookup", "sleep", {"seconds": 1.5}),
            {"id": "review", "kind": "approval", "prompt": "Send the reply to the customer?"},
            {"id": "close", **LLM, "prompt": "Close the ticket: {{ steps.draft.output.text }}"},
        ],
    )
    celery_workers()
    run, _ = run_create(workflow_name="incident-reply", input={"ticket": "printer on fire"}, created_by="olga")
    page.goto(f"{site}/runs/{run.id}/")
    page.evaluate("window.samePage = true")  # gone if anything reloaded the page

    # The journal follows the run over the event stream while a real worker walks it.
    page.wait_for_selector("#journal-rows tr.k-child_created")
    page.wait_for_selector("#journal-rows tr.k-approval_requested")
    expect(page.locator("#journal-live")).to_have_text("following live")
    seqs = [int(s) for s in page.locator("#journal-rows tr.ev td.seq").all_inner_texts()]
    assert seqs == list(range(1, len(seqs) + 1))
    # The waterfall and the header keep up on their own.
    expect(page.locator("#waterfall .wf-row")).to_have_count(4)
    expect(page.locator("#waterfall .bar-waiting")).to_have_count(1)
    expect(page.locator("#run-header .status")).to_have_text("waiting")
    expect(page.locator("#run-header .why")).to_contain_text("waiting on the approval of step 'review'")
    page.click("#waterfall details.wf-child summary")  # the child run's waterfall, nested
    expect(page.locator("#waterfall .wf-nested .wf-row")).to_have_count(2)

    approval = page.locator("#run-actions form.approval")
    expect(approval).to_contain_text("Send the reply to the customer?")
    approval.locator("input[name=comment]").fill("looks right")
    approval.locator("button[value='1']").click()
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Approved step review")
    page.wait_for_selector("#journal-rows tr.k-run_succeeded")
    expect(page.locator("#run-header .status")).to_have_text("succeeded")
    expect(page.locator("#journal-live")).to_contain_text("the run has ended (succeeded)")
    expect(page.locator("#receipt")).to_contain_text("step review approved by olga")
    assert page.evaluate("window.samePage") is True
    assert step_events(run, "approval_decided")[0].payload == {
        "approved": True,
        "by": "olga",
        "comment": "looks right",
        "attempt": 1,
    }
    page.click("#waterfall details.wf-child summary")  # folded, the waterfall catches up with the run's end
    expect(page.locator("#waterfall .wf-row")).to_have_count(5)
    expect(page.locator("#waterfall .bar-waiting")).to_have_count(0)
    page.mouse.move(0, 0)
    page.wait_for_timeout(2500)  # the fresh rows' highlight fades
    screenshot(page, "run.png")


def test_an_operator_redrives_a_run_whose_worker_was_killed(page, site, celery_workers):
    workflow = make_workflow(
        name="slow-lookup",
        steps=[echo_step("fetch", id=7), tool_step("nap", "sleep", {"seconds": 3}), echo_step("after", done=True)],
    )
    first = celery_workers()
    run, _ = run_create(workflow_name=workflow.name, input={}, created_by="olga")
    wait_until(lambda: step_events(run, "step_started", "nap"), what="the worker to start the nap")
    first.kill()  # SIGKILL in the middle of the step: its lease stops being renewed
    wait_until(
        lambda: RunLock.objects.filter(run_id=run.id, expires_at__lt=timezone.now()).exists(),
        what="the dead worker's lease to expire",
    )
    celery_workers()  # a new worker; no beat runs here, so only the operator re-drives

    page.goto(f"{site}/runs/{run.id}/")
    expect(page.locator("#run-header .why")).to_contain_text("lease expired")
    expect(page.locator("#run-header .countdown")).to_contain_text("expired")
    page.click("#redrive-panel summary")
    preview = page.locator("#redrive")
    expect(preview).to_contain_text("again, same attempt and key")  # nap had started: same key
    expect(preview.locator("tr", has_text="fetch")).to_contain_text("reused")
    preview.locator("input[name=reason]").fill("worker host died")
    preview.locator("button[type=submit]").click()
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Re-driven by olga: worker host died")
    page.wait_for_selector("#journal-rows tr.k-run_redriven")
    page.wait_for_selector("#journal-rows tr.k-run_succeeded")
    expect(page.locator("#run-header .status")).to_have_text("succeeded")
    expect(page.locator("#waterfall .wf-line.line-redrive")).to_have_count(1)
    expect(page.locator("#waterfall .bar-interrupted")).to_have_count(1)  # the nap the worker died in
    expect(page.locator("#waterfall .bar-cached")).to_have_count(1)  # fetch, reused from the journal
    redriven = step_events(run, "run_redriven")[0].payload
    assert (redriven["by"], redriven["why"], redriven["force"]) == ("olga", "worker host died", False)


def test_a_refused_redrive_reads_as_a_message_and_force_steals_the_lease(page, site):
    run = make_run(steps=[echo_step("a")])  # booked for a task for PAL_LEASE_TTL: a live lease, no worker here
    page.goto(f"{site}/runs/{run.id}/")
    page.click("#redrive-panel summary")
    expect(page.locator("#redrive")).to_contain_text("A live lease holds the run")
    page.fill("#redrive input[name=reason]", "impatient")
    page.click("#redrive button[type=submit]")
    expect(page.locator("#redrive .notice-error")).to_contain_text("is held by a live lease")
    assert page.input_value("#redrive input[name=reason]") == "impatient"  # the panel stayed open, reason kept
    assert step_events(run, "run_redriven") == []
    page.check("#redrive input[name=force]")
    page.click("#redrive button[type=submit]")
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Re-driven (forced) by olga: impatient")
    page.wait_for_selector("#journal-rows tr.k-run_redriven")
    assert step_events(run, "run_redriven")[0].payload["force"] is True


def test_an_operator_cancels_a_waiting_run_and_the_stream_ends(page, site):
    run = make_run(steps=[echo_step("build"), {"id": "ci", "kind": "signal", "name": "ci-done"}])
    drive(run)  # a worker's walk, inline: it parks on the signal
    assert run.status == RunStatus.WAITING
    page.goto(f"{site}/runs/{run.id}/")
    expect(page.locator("#run-actions")).to_contain_text("It waits on the signal ci-done")
    page.fill("#run-actions input[name=reason]", "the release was called off")
    page.click("#run-actions button:has-text('Cancel the run')")
    expect(page.locator("#run-notice .notice-ok")).to_contain_text("Cancelled by olga")
    expect(page.locator("#run-header .status")).to_have_text("cancelled")
    page.wait_for_selector("#journal-rows tr.k-run_cancelled")
    expect(page.locator("#journal-live")).to_contain_text("the run has ended (cancelled)")
    expect(page.locator("#run-actions")).to_contain_text("nothing to act on")
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED
    assert step_events(run, "run_cancelled")[0].payload["why"] == "the release was called off"


# --- the ops dashboard ----------------------------------------------------------------------------


def test_the_ops_dashboard_shows_what_needs_an_operator_and_takes_decisions(page, site, settings):
    settings.MAILERS = mailer(CRASHING_MAIL)
    mailed = make_run(
        steps=[
            echo_step("greet", who="Ada"),
            {
                "id": "mail",
                "kind": "deliver",
                "channel": "email",
                "to": ["ops@example.com"],
                "subject": "Ticket {{ input.id }}",
                "body": "Hello {{ steps.greet.output.who }}",
            },
        ],
        input={"id": 42},
    )
    with pytest.raises(Crash):
        drive(mailed)  # the worker died while talking to the mail server
    settings.MAILERS = mailer(LOCMEM_MAIL)
    sweep_after_expiry(mailed)  # the sweep re-drove it (a Sweep row) ...
    drive_to_end(mailed)  # ... and the email, maybe sent, was not sent again: unconfirmed
    effect = SideEffect.objects.get(run=mailed)
    assert effect.status == SideEffectStatus.UNCONFIRMED

    for _ in range(3):
        drive_to_end(make_run(steps=[echo_step("a")]))
    waiting = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Refund 40 EUR to the customer?"}])
    drive(waiting)
    dead = make_run(steps=[echo_step("a")])
    Run.objects.filter(id=dead.id).update(status=RunStatus.RUNNING)
    RunLock.objects.filter(run_id=dead.id).update(owner="worker-3:4242:9f1c", expires_at=timezone.now())
    lost = make_run(steps=[echo_step("b")])  # booked for a task that no worker ever took
    RunLock.objects.filter(run_id=lost.id).update(expires_at=timezone.now())

    page.goto(f"{site}/ops/")
    stuck = page.locator("#stuck")
    expect(stuck).to_contain_text("Lease expired: its worker stopped heartbeating")
    expect(stuck).to_contain_text("worker-3:4242:9f1c")
    expect(stuck).to_contain_text("Booked for a task nobody took")
    expect(page.locator("#approvals")).to_contain_text("Refund 40 EUR to the customer?")
    row = page.locator(f"#effect-{effect.id}")
    expect(row).to_contain_text("unconfirmed")
    expect(page.locator(".sweep")).to_contain_text("last ran")
    expect(page.locator("#sweeps")).to_contain_text(str(mailed.id)[:8])
    page.mouse.move(0, 0)
    screenshot(page, "ops.png")

    row.locator("input[name=reason]").fill("the customer has it")
    row.locator("button[value=mark_delivered]").click()
    expect(page.locator(f"#effect-{effect.id}")).to_contain_text("Marked delivered by olga")
    assert SideEffect.objects.get(id=effect.id).status == SideEffectStatus.DELIVERED
    resolved = step_events(mailed, "side_effect_resolved")[0].payload
    assert (resolved["by"], resolved["why"], resolved["decision"]) == ("olga", "the customer has it", "mark_delivered")

    approval = page.locator(f"#approval-{waiting.id}")
    approval.locator("input[name=comment]").fill("too much")
    approval.locator("button[value='0']").click()
    expect(page.locator(f"#approval-{waiting.id}")).to_contain_text("Rejected step review")
    assert step_events(waiting, "approval_decided")[0].payload["approved"] is False

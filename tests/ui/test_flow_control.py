"""Flow control in a real browser (issue 14): Debian's Chromium through Playwright against uvicorn on the test
database, as tests/ui/test_browser.py starts them. An operator runs a schedule's whole life from /schedules/ (each
action with a reason, recorded as a ScheduleEvent with who and why), raises the budget of a run waiting on it from
the keyboard alone, and reads the configured rate limits on /ops/. axe-core finds no serious or critical violation
on /schedules/ with a schedule nor on /ops/ with a budget row."""

import json
from zoneinfo import ZoneInfo

import pytest

from runs.models import RateSlot, Run, RunStatus, Schedule, ScheduleEvent, Workflow
from runs.schedules import schedule_create
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, step_events
from tests.support import workers as worker_support
from tests.support.web import uvicorn_server
from tests.ui.test_accessibility import Audit, tab_to

# The browser and the logged-in window of the browser tests; the server is this module's own (below).
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The server is a subprocess: it reads its rate limits from the environment, as in production.
RATE_LIMITS = {"llm:m": {"requests_per_minute": 30}}


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tmp_path_factory):
    """uvicorn serving pal.asgi on the test database with PAL_RATE_LIMITS set, for the whole module."""
    with django_db_blocker.unblock():
        database = worker_support.database_url()
    env = {"DJANGO_ALLOWED_HOSTS": "127.0.0.1", "PAL_RATE_LIMITS": json.dumps(RATE_LIMITS)}
    with uvicorn_server(
        database_url=database, env=env, log_dir=tmp_path_factory.mktemp("uvicorn"), ready_path="/accounts/login/"
    ) as server:
        yield server


@pytest.fixture
def rate_limited(settings):
    """This process drives runs inline: it takes its rate-limit slots under the same limits as the server shows."""
    settings.PAL_RATE_LIMITS = RATE_LIMITS


def waiting_on_budget() -> Run:
    """A run whose first model call spent its whole budget of one token: its second call waits on the budget."""
    workflow_create(
        definition={
            "name": "capped",
            "budget": {"max_tokens": 1},
            "steps": [
                {"id": "a", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "one"},
                {"id": "b", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "two"},
            ],
        }
    )
    run = make_run(workflow=Workflow.objects.get(name="capped"))
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "budget"
    return run


def schedule_row(window, schedule_id):
    return window.locator(f'tr[data-schedule="{schedule_id}"]')


def act_on_schedule(window, schedule_id, button: str, reason: str) -> None:
    row = schedule_row(window, schedule_id)
    row.locator("input[name=reason]").fill(reason)
    row.get_by_role("button", name=button).click()
    expect(window.locator("ul.messages")).to_contain_text(f"Schedule {str(schedule_id)[:8]}: {button.lower()} done")


def test_an_operator_creates_pauses_resumes_and_deletes_a_schedule_each_with_a_reason(page, site):  # noqa: F811
    workflow_create(definition={"name": "nightly", "steps": [echo_step("report")]})
    page.goto(f"{site}/schedules/")
    expect(page.locator("main")).to_contain_text("No schedule yet.")

    page.fill("input[name=workflow]", "nightly")
    page.fill("input[name=cron]", "0 9 * * 1-5")
    page.fill("input[name=timezone]", "Europe/Berlin")
    page.fill("input[name=reason]", "the weekday report")
    page.get_by_role("button", name="Create").click()
    expect(page.locator("ul.messages")).to_contain_text("Schedule created")

    schedule = Schedule.objects.get()
    assert (schedule.workflow_name, schedule.cron, schedule.timezone, schedule.enabled) == (
        "nightly",
        "0 9 * * 1-5",
        "Europe/Berlin",
        True,
    )
    local = schedule.next_fire_at.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (9, 0) and local.isoweekday() <= 5  # 09:00 in Berlin, on a weekday
    next_fire = schedule_row(page, schedule.id).locator("[data-field=next_fire_at]")
    expect(next_fire).to_contain_text(f"{local:%Y-%m-%d %H:%M}")
    expect(next_fire).to_contain_text(f"{schedule.next_fire_at.astimezone(ZoneInfo('UTC')):%Y-%m-%d %H:%M} UTC")

    act_on_schedule(page, schedule.id, "Pause", "holidays")
    expect(schedule_row(page, schedule.id).locator("[data-field=next_fire_at]")).to_have_text("paused")
    expect(schedule_row(page, schedule.id).get_by_role("button", name="Resume")).to_be_visible()
    assert Schedule.objects.get().enabled is False

    act_on_schedule(page, schedule.id, "Resume", "back at work")
    resumed = Schedule.objects.get()
    assert resumed.enabled is True and resumed.next_fire_at is not None
    expect(schedule_row(page, schedule.id).locator("[data-field=next_fire_at]")).to_contain_text(
        f"{resumed.next_fire_at.astimezone(ZoneInfo('Europe/Berlin')):%Y-%m-%d %H:%M}"
    )
    expect(schedule_row(page, schedule.id).get_by_role("button", name="Pause")).to_be_visible()

    act_on_schedule(page, schedule.id, "Delete", "replaced by a webhook")
    expect(schedule_row(page, schedule.id)).to_have_count(0)
    expect(page.locator("main")).to_contain_text("No schedule yet.")
    assert not Schedule.objects.exists()

    events = ScheduleEvent.objects.filter(schedule_id=schedule.id).order_by("id")
    assert [(e.kind, e.by, e.reason) for e in events] == [
        ("created", "olga", "the weekday report"),
        ("paused", "olga", "holidays"),
        ("resumed", "olga", "back at work"),
        ("deleted", "olga", "replaced by a webhook"),
    ]


def test_an_operator_raises_a_waiting_runs_budget_from_the_keyboard_and_the_run_is_woken(page, site, rate_limited):  # noqa: F811
    run = waiting_on_budget()

    page.goto(f"{site}/ops/")
    budgets = page.locator("#budgets")
    expect(budgets).to_contain_text("Pending budget decisions")
    expect(budgets.locator(f'a[href="/runs/{run.id}/"]')).to_have_text(str(run.id)[:8])
    expect(budgets).to_contain_text("of max_tokens 1")
    limits = page.locator("#rate-limits")
    expect(limits).to_contain_text("llm:m")
    slots = RateSlot.objects.filter(key="llm:m").count()
    assert slots >= 1  # the first call took a slot of the limit
    expect(limits.locator("tr", has_text="llm:m")).to_contain_text(f"{slots} of 30")

    page.goto(f"{site}/runs/{run.id}/")
    tab_to(page, "#budget-panel input[name=max_tokens]")
    page.keyboard.press("Control+a")  # the field holds the cap reached; typing replaces it
    page.keyboard.type("1000")
    tab_to(page, "#budget-panel input[name=reason]")
    page.keyboard.type("worth it")
    page.keyboard.press("Enter")
    expect(page.locator("ul.messages")).to_contain_text(f"Budget of run {run.id} changed by olga")

    (raised,) = step_events(run, "budget_raised")
    assert (raised.payload["by"], raised.payload["why"], raised.payload["max_tokens"]) == ("olga", "worth it", 1000)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.waiting_on is None  # woken: a worker may take it on
    expect(page.locator("#budget-panel")).to_have_count(0)

    drive_to_end(run)  # the walk a worker would make, inline: the second call now fits the budget
    assert run.status == RunStatus.SUCCEEDED


def test_schedules_and_ops_with_a_budget_row_have_no_serious_accessibility_violation(page, site, rate_limited):  # noqa: F811
    workflow_create(definition={"name": "nightly", "steps": [echo_step("report")]})
    schedule_create(workflow="nightly", cron="0 3 * * *", timezone_name="Asia/Tokyo", by="olga", reason="report")
    waiting_on_budget()
    audit = Audit(page)
    audit.visit(f"{site}/schedules/", "the schedules page with a schedule")
    expect(page.locator("main")).to_contain_text("Asia/Tokyo")
    audit.visit(f"{site}/ops/", "the ops dashboard with a budget row and a rate limit")
    expect(page.locator("#budgets .budget-row")).to_have_count(1)
    expect(page.locator("#rate-limits")).to_contain_text("llm:m")
    audit.assert_clean()

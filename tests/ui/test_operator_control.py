"""Operator control in a real browser (issue 27): Debian's Chromium through Playwright against uvicorn and real
Celery workers, as tests/ui/test_browser.py starts them. After a receiver's outage an operator selects the failed
runs on /reruns/, previews what each would reuse and run again, names the incident, starts a paced rerun and
watches it finish run by run; an operator pauses a workflow from its page with a reason, reads the held run's why
on its page, and resumes it paced from /ops/. axe-core finds no serious violation on the reruns pages."""

import re

import pytest

from runs.models import Pause, Rerun, RerunStatus, Run, RunStatus
from runs.services import workflow_create
from tests.helpers import drive, drive_to_end, echo_step, events, make_run, make_workflow, webhook
from tests.ui.test_accessibility import Audit

# The browser, the logged-in window and the server of the browser tests.
from tests.ui.test_browser import _orm_beside_playwright, browser, expect, page, site, wait_until  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ONE_TRY = {"PAL_TRANSPORT_RETRIES": "0", "PAL_UNKNOWN_RETRIES": "0"}  # a call fails at once while the peer is down


@pytest.fixture
def one_try(settings):
    """This process drives the runs that fail: one try, as the workers are told (ONE_TRY)."""
    settings.PAL_TRANSPORT_RETRIES = 0
    settings.PAL_UNKNOWN_RETRIES = 0


def failed_at_the_webhook(receiver, n: int) -> list[Run]:
    """n runs of `notify-customers` failed at their webhook while the receiver was down; it is back after."""
    workflow = workflow_create(
        definition={"name": "notify-customers", "steps": [echo_step("prepare"), webhook("notify", receiver.url, {})]}
    )
    receiver.unavailable = True
    runs = [make_run(workflow=workflow, input={"n": i}) for i in range(n)]
    for run in runs:
        drive_to_end(run)
        assert run.status == RunStatus.FAILED and run.error["code"] == "webhook_unavailable"
    receiver.unavailable = False
    return runs


def test_an_operator_previews_starts_and_watches_a_rerun_of_the_runs_an_outage_failed(
    page,  # noqa: F811
    site,  # noqa: F811
    celery_workers,
    webhook_receiver,
    one_try,
):
    runs = failed_at_the_webhook(webhook_receiver, 3)
    celery_workers({**webhook_receiver.env(), **ONE_TRY})

    page.goto(f"{site}/reruns/")
    expect(page.locator("#reruns")).to_contain_text("No rerun yet.")
    form = page.get_by_role("form", name="Select runs")
    form.locator("select[name=workflow]").select_option("notify-customers")
    form.locator("input[name=step_id]").fill("notify")
    form.locator("input[name=error_code]").fill("webhook_unavailable")
    form.locator("input[name=per_second]").fill("2")
    form.get_by_role("button", name="Preview").click()

    preview = page.locator("#rerun-preview")
    expect(preview.locator("[data-field=count]")).to_have_text("3 runs")
    expect(preview).to_contain_text("3 failed runs retried in place")
    expect(preview.locator("tbody tr")).to_have_count(3)
    first = preview.locator(f'tr[data-run="{runs[0].id}"]')
    expect(first.locator(".tag-reused")).to_have_text("prepare")
    expect(first.locator(".tag-rerun")).to_have_text("notify #1")  # its outcome was unknown: the same key again
    assert "preview=1" in page.url and "step_id=notify" in page.url  # the preview's address can be shared

    start = page.get_by_role("form", name="Start the rerun")
    start.locator("input[name=name]").fill("INC-42 receiver outage")
    start.locator("input[name=reason]").fill("the receiver is back")
    expect(start.locator("input[name=per_second]")).to_have_value("2")
    start.get_by_role("button", name="Start: rerun 3 runs").click()

    page.wait_for_url(re.compile(r"/reruns/[0-9a-f-]{36}/$"))
    expect(page.locator("ul.messages")).to_contain_text("Rerun “INC-42 receiver outage” started: 3 run(s)")
    progress = page.locator("#rerun-progress")
    expect(progress.locator("[data-field=status]")).to_have_text("done")  # live, without a reload
    expect(progress).to_contain_text("3 of 3")
    expect(progress.locator(".status-succeeded")).to_have_count(3)  # it watches the runs it reran until they end
    expect(progress).to_contain_text("3 retried in place · 0 forked · 0 refused")

    rerun = Rerun.objects.get()
    assert (rerun.status, rerun.by, rerun.per_second, rerun.done) == (RerunStatus.DONE, "olga", 2, 3)
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED
        (retried,) = events(run, "run_retried")
        assert retried.payload["rerun_job"] == {"id": str(rerun.id), "name": "INC-42 receiver outage"}
        assert (retried.payload["by"], retried.payload["why"]) == ("olga", "the receiver is back")
    assert sorted(webhook_receiver.dedup.values()) == [1, 1, 1]

    audit = Audit(page)
    audit.scan("a rerun's page, done")
    audit.visit(f"{site}/reruns/?workflow=notify-customers&status=succeeded&from_step=notify&preview=1", "a preview")
    expect(page.locator("#rerun-preview [data-field=count]")).to_have_text("3 runs")
    expect(page.locator("#reruns")).to_contain_text("INC-42 receiver outage")
    audit.assert_clean()


def test_an_operator_pauses_a_workflow_reads_the_held_runs_why_and_resumes_it_paced(
    page,  # noqa: F811
    site,  # noqa: F811
    celery_workers,
):
    digest = make_workflow(name="digest", steps=[echo_step("collect"), echo_step("send")])

    page.goto(f"{site}/workflows/digest/")
    pausing = page.locator("#pause")
    pausing.locator("input[name=reason]").fill("the digest template is broken")
    pausing.get_by_role("button", name="Pause the workflow").click()
    expect(page.locator("ul.messages")).to_contain_text("Paused workflow digest")
    expect(page.locator("#pause")).to_contain_text("Paused by olga: the digest template is broken")

    held = [make_run(workflow=digest, input={"n": i}) for i in range(2)]
    for run in held:
        drive(run)  # its walk's first slice finds the pause and parks the run
        assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "paused"
    page.goto(f"{site}/runs/{held[0].id}/")
    expect(page.locator("#run-header .status")).to_have_text("waiting")
    expect(page.locator("#run-header .why")).to_contain_text(
        "paused: workflow digest by olga: the digest template is broken"
    )

    page.goto(f"{site}/ops/")
    pause = Pause.objects.get(target="digest")
    row = page.locator(f"#pause-{pause.id}")
    expect(row).to_contain_text("workflow digest")
    expect(row.locator("td").nth(4)).to_have_text("2")  # the runs it holds
    celery_workers()
    row.locator("input[name=reason]").fill("template mended")
    row.locator("input[name=per_second]").fill("2")
    row.get_by_role("button", name="Resume").click()
    expect(page.locator("ul.messages")).to_contain_text("Resumed workflow digest: 2 held run(s) released, 2 a second")
    expect(page.locator("#pauses")).to_contain_text("Nothing is paused.")

    wait_until(
        lambda: Run.objects.filter(id__in=[r.id for r in held], status=RunStatus.SUCCEEDED).count() == 2,
        what="the held runs to finish after the paced resume",
    )
    pause.refresh_from_db()
    assert (pause.resumed_by, pause.resume_reason, pause.per_second) == ("olga", "template mended", 2)
    for run in held:
        (resumed,) = events(run, "run_resumed")
        assert resumed.payload["by"] == "olga" and "template mended" in resumed.payload["why"]

"""The workflow pages (/workflows/ and /workflows/<name>/) against runs made here and driven inline: the numbers
on the pages are the runs' own (counted from the runs and their journal in the test), the start form checks its
input by field and answers 422, never 500, and reading and starting need the same permissions as the other pages."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from journal.models import JournalEvent
from runs import workflow_stats
from runs.models import Run, RunStatus
from runs.pages.formatting import duration_text, usd
from runs.services import run_cancel, workflow_create
from tests.helpers import drive_to_end, make_run, tool_step
from tests.pages.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
V1 = {
    "name": "triage",
    "description": "sort the tickets",
    "steps": [{"id": "plan", **LLM, "prompt": "Plan {{ input.q }}"}, tool_step("act", "echo", {"q": "{{ input.q }}"})],
}
V2 = {**V1, "steps": [*V1["steps"], tool_step("tell", "echo", {"done": True}, needs=["plan"])]}


@pytest.fixture
def triage():
    """triage v1 and v2; four runs of v2 driven to success with durations 1, 2, 3 and 10 s, one run cancelled
    before it started, and one succeeded run from two days ago (outside the 24 hours)."""
    workflow_create(definition=V1)
    v2 = workflow_create(definition=V2)
    now = timezone.now()
    done = []
    for seconds in (1, 2, 3, 10):
        run = make_run(workflow=v2, input={"q": f"ticket {seconds}"})
        drive_to_end(run)
        assert run.status == RunStatus.SUCCEEDED
        started = now - timedelta(minutes=30)
        Run.objects.filter(id=run.id).update(started_at=started, finished_at=started + timedelta(seconds=seconds))
        done.append(run)
    cancelled = make_run(workflow=v2, input={"q": "never"})
    run_cancel(run_id=cancelled.id, by="otto", reason="not needed")
    old = make_run(workflow=v2, input={"q": "old"})
    drive_to_end(old)
    Run.objects.filter(id=old.id).update(created_at=now - timedelta(days=2))
    return {"done": done, "cancelled": cancelled, "old": old, "v2": v2}


def cost_in_journal(runs) -> float:
    """What the runs' model calls cost, as their step_completed events say."""
    return sum(
        e.payload["output"]["cost_usd"]
        for e in JournalEvent.objects.filter(run_id__in=[r.id for r in runs], kind="step_completed", step_id="plan")
    )


def test_the_summary_counts_the_last_24_hours_runs_their_success_rate_durations_and_cost(triage):
    (summary,) = workflow_stats.workflow_summaries(names=["triage"])
    assert summary["workflow"].version == 2
    assert (summary["runs"], summary["ended"], summary["succeeded"]) == (5, 5, 4)
    assert summary["success_rate"] == pytest.approx(4 / 5)
    # percentile_cont over 1, 2, 3, 10 (the cancelled run never started: no duration)
    assert summary["p50_s"] == pytest.approx(2.5)
    assert summary["p95_s"] == pytest.approx(workflow_stats.percentile([1, 2, 3, 10], 0.95)) == pytest.approx(8.95)
    expected = cost_in_journal(triage["done"]) / 5
    assert expected > 0
    assert summary["cost_per_run"] == pytest.approx(expected)
    assert summary["cost_runs"] == 5


def test_percentile_interpolates_between_ranks_as_percentile_cont_does():
    assert workflow_stats.percentile([], 0.5) is None
    assert workflow_stats.percentile([4], 0.95) == 4
    assert workflow_stats.percentile([3, 1, 2], 0.5) == 2
    assert workflow_stats.percentile([0, 10], 0.95) == pytest.approx(9.5)


def test_the_list_shows_every_workflow_with_its_latest_version_and_numbers(triage, viewer):
    workflow_create(definition={"name": "idle", "steps": [tool_step("only", "echo")]})
    page = viewer.get("/workflows/")
    assert page.status_code == 200
    html = page.content.decode()
    row = re.search(r'<tr data-workflow="triage">(.*?)</tr>', html, re.S).group(1)
    assert "v2" in row and ">5</a>" in row and "80% " in row and "(4 of 5)" in row
    assert duration_text(2.5) in row and duration_text(workflow_stats.percentile([1, 2, 3, 10], 0.95)) in row
    assert usd(cost_in_journal(triage["done"]) / 5) in row
    idle = re.search(r'<tr data-workflow="idle">(.*?)</tr>', html, re.S).group(1)
    assert 'data-field="runs">0<' in idle and 'data-field="success_rate">—<' in idle


def test_runs_by_status_per_hour_counts_each_hour_by_creation(triage):
    now = timezone.now()
    two_hours_ago = now - timedelta(hours=2)
    Run.objects.filter(id=triage["cancelled"].id).update(created_at=two_hours_ago)
    buckets = workflow_stats.runs_by_status_per_hour(name="triage", now=now)
    assert len(buckets) == 24 and buckets[-1]["start"] <= now
    by_start = {b["start"]: b["counts"] for b in buckets}
    assert by_start[two_hours_ago.replace(minute=0, second=0, microsecond=0)] == {"cancelled": 1}
    assert sum(c.get("succeeded", 0) for c in by_start.values()) == 4  # the old one is outside the window


def test_durations_per_hour_are_the_percentiles_of_that_hours_ended_runs(triage):
    buckets = workflow_stats.durations_per_hour(name="triage")
    filled = [b for b in buckets if b["p50_s"] is not None]
    assert len(filled) == 1 and filled[0]["start"] == buckets[-1]["start"]  # all four were created this hour
    assert filled[0]["p50_s"] == pytest.approx(2.5) and filled[0]["p95_s"] == pytest.approx(8.95)


def test_cost_per_day_puts_each_runs_cost_on_the_day_it_was_created(triage):
    days = workflow_stats.cost_per_day(name="triage", days=3)
    assert [d["runs"] for d in days] == [1, 0, 5]
    assert days[0]["cost_usd"] == pytest.approx(cost_in_journal([triage["old"]]))
    assert days[2]["cost_usd"] == pytest.approx(cost_in_journal(triage["done"]))


def test_the_workflow_page_draws_the_graph_the_charts_and_the_diff_between_versions(triage, viewer):
    page = viewer.get("/workflows/triage/")
    assert page.status_code == 200
    html = page.content.decode()
    assert re.findall(r'<g class="wfg-step" data-step="([^"]+)"', html) == ["plan", "act", "tell"]
    assert 'data-from="plan" data-to="tell"' in html and 'data-from="plan" data-to="act"' in html
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 3
    assert 'data-series="succeeded" data-value="4"' in html  # this hour's bar
    assert '<span class="diff-line diff-add">+' in html and "tell" in html  # v1 → v2 added the step
    assert "Starting a run needs the operator permission" in html  # a viewer sees no form
    assert 'name="input"' not in html


def test_the_same_version_twice_has_no_diff_and_an_unknown_version_is_named_not_a_500(triage, viewer):
    same = viewer.get("/workflows/triage/?a=2&b=2").content.decode()
    assert 'id="no-diff"' in same
    unknown = viewer.get("/workflows/triage/?a=9&b=x")
    assert unknown.status_code == 200
    assert "version &#x27;9&#x27; (a) does not exist" in unknown.content.decode()
    assert "version &#x27;x&#x27; (b) does not exist" in unknown.content.decode()


def test_an_unknown_workflow_is_a_404(viewer):
    assert viewer.get("/workflows/nothing-here/").status_code == 404
    assert viewer.post("/workflows/nothing-here/start/").status_code == 403  # a viewer may not start anything


def test_reading_needs_a_login_and_a_reader(anonymous, nobody, triage):
    answer = anonymous.get("/workflows/")
    assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]
    assert nobody.get("/workflows/").status_code == 403
    assert nobody.get("/workflows/triage/").status_code == 403


def test_an_operator_starts_a_run_from_the_form(triage, operator):
    page = operator.get("/workflows/triage/").content.decode()
    assert 'name="input"' in page and "ticket" in page  # prefilled with the newest run's input
    answer = operator.post("/workflows/triage/start/", {"version": "1", "input": '{"q": "from the form"}'})
    assert answer.status_code == 302
    run = Run.objects.get(input={"q": "from the form"})
    assert answer["Location"] == f"/runs/{run.id}/"
    assert (run.workflow.version, run.created_by, run.status) == (1, "otto", RunStatus.QUEUED)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"q": ', "input: not valid JSON: Expecting value at line 1, column 6"),
        ('["a list"]', "input: must be a JSON object ({...}), not a list"),
        ('"text"', "input: must be a JSON object ({...}), not a string"),
        ("42", "input: must be a JSON object ({...}), not a number"),
        ('{"n": NaN}', "input: n: NaN is not a number JSON allows: only finite numbers are accepted"),
        ('{"n": [1e999]}', "input: n[0]: 1e999 is too large for a number"),
        ('{"t": "a\\u0000b"}', "input: t: holds a NUL character"),
    ],
)
def test_a_bad_input_is_refused_by_field_with_422_and_starts_nothing(triage, operator, text, error):
    before = Run.objects.count()
    answer = operator.post("/workflows/triage/start/", {"version": "2", "input": text})
    assert answer.status_code == 422
    html = answer.content.decode()
    assert 'id="input-error"' in html and error.replace("'", "&#x27;") in html
    assert 'aria-invalid="true"' in html
    assert Run.objects.count() == before


def test_an_unknown_version_is_refused_by_field(triage, operator):
    answer = operator.post("/workflows/triage/start/", {"version": "7", "input": "{}"})
    assert answer.status_code == 422
    assert 'id="version-error"' in answer.content.decode()


def test_an_idempotency_key_used_with_another_input_is_refused_not_a_500(triage, operator):
    first = operator.post("/workflows/triage/start/", {"version": "2", "input": '{"q": 1}', "idempotency_key": "k-1"})
    again = operator.post("/workflows/triage/start/", {"version": "2", "input": '{"q": 1}', "idempotency_key": "k-1"})
    assert first.status_code == again.status_code == 302 and first["Location"] == again["Location"]
    other = operator.post("/workflows/triage/start/", {"version": "2", "input": '{"q": 2}', "idempotency_key": "k-1"})
    assert other.status_code == 422
    assert "idempotency_conflict" in other.content.decode()


def test_starting_needs_the_operator_permission_and_a_csrf_token(triage, viewer):
    assert viewer.post("/workflows/triage/start/", {"version": "2", "input": "{}"}).status_code == 403
    assert viewer.get("/workflows/triage/start/").status_code in (403, 405)
    strict = logged_in(make_user("olaf", "runs.view_run", "runs.operate"), enforce_csrf_checks=True)
    assert strict.post("/workflows/triage/start/", {"version": "2", "input": "{}"}).status_code == 403
    assert Run.objects.filter(created_by="olaf").count() == 0
    assert isinstance(strict, Client)

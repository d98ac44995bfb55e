"""The rerun calls of CONTRACT section 12: POST /reruns (dry_run: the count and a preview), GET /reruns,
GET /reruns/{id}, POST /reruns/{id}/abort; who may; 422 naming the field; 404 and 409."""

import uuid

import pytest

from runs.models import Rerun, RerunItem
from tests.api.conftest import assert_error
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, record_drive_sends, tool_step

pytestmark = pytest.mark.django_db

FLAKY = tool_step("charge", "test_fail_before", {"succeed_on": 2})


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    record_drive_sends(monkeypatch)
    monkeypatch.setattr("runs.dispatch.rerun", type("Sent", (), {"apply_async": lambda *a, **k: None})())


def failed_runs(n: int, name: str = "billing") -> list:
    workflow = make_workflow(steps=[echo_step("load"), FLAKY], name=name)
    runs = [make_run(workflow=workflow, input={"n": i}) for i in range(n)]
    for run in runs:
        drive_to_end(run)
    return runs


def test_a_dry_run_counts_exactly_the_runs_the_list_shows_for_the_same_filter(operator):
    failed_runs(4)
    failed_runs(2, name="other")

    body = {
        "filter": {"workflow": "billing", "step_id": "charge"},
        "from_step": "failed",
        "reason": "r",
        "dry_run": True,
    }
    response = operator.post("/reruns", body)

    assert response.status_code == 200, response.content
    preview = response.json()
    listed = operator.get("/runs", {"workflow": "billing", "status": "failed"}).json()["items"]
    assert preview["count"] == len(listed) == 4 and preview["id"] is None and preview["status"] == "dry_run"
    assert preview["actions"] == {"retry": 4, "fork": 0}
    assert {plan["run_id"] for plan in preview["preview"]} == {run["id"] for run in listed}
    assert preview["preview"][0]["rerun"][0]["step_id"] == "charge"
    assert not Rerun.objects.exists()


def test_an_operator_starts_a_rerun_and_reads_its_progress(operator, viewer):
    runs = failed_runs(3)

    response = operator.post(
        "/reruns", {"filter": {"workflow": "billing"}, "from_step": "failed", "reason": "psp down", "name": "INC-12"}
    )

    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["count"], job["done"], job["status"], job["name"], job["by"]) == (3, 0, "running", "INC-12", "otto")
    assert job["filter"] == {"workflow": "billing", "status": "failed"}
    assert set(RerunItem.objects.values_list("run_id", flat=True)) == {run.id for run in runs}
    assert viewer.get(f"/reruns/{job['id']}").json()["refusals"] == []
    assert [item["id"] for item in viewer.get("/reruns").json()["items"]] == [job["id"]]


def test_an_abort_records_who_and_why_and_a_second_one_is_a_conflict(operator):
    failed_runs(1)
    job = operator.post("/reruns", {"from_step": "failed", "reason": "psp down"}).json()

    aborted = operator.post(f"/reruns/{job['id']}/abort", {"reason": "wrong filter"})
    again = operator.post(f"/reruns/{job['id']}/abort", {"reason": "again"})

    assert aborted.status_code == 200, aborted.content
    assert (aborted.json()["status"], aborted.json()["aborted_by"], aborted.json()["abort_reason"]) == (
        "aborted",
        "otto",
        "wrong filter",
    )
    assert_error(again, 409, "rerun_ended")


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"filter": {"status": "running"}, "from_step": "failed"}, "filter.status", "invalid_filter"),
        ({"filter": {"status": "succeeded"}, "from_step": "failed"}, "filter.status", "invalid_filter"),
        ({"filter": {"created_after": "yesterday"}, "from_step": "failed"}, "filter.created_after", "invalid_filter"),
        ({"filter": {"workflow": "nope"}, "from_step": "failed"}, "filter.workflow", "invalid_filter"),
        ({"filter": {"workflow": "billing"}, "from_step": "ship"}, "from_step", "unknown_step"),
        ({"filter": {"step_id": "Not A Step"}, "from_step": "failed"}, "filter.step_id", "invalid_filter"),
        ({"filter": {"view": "7"}, "from_step": "failed"}, "filter.view", "invalid_filter"),
        ({"filter": {"colour": "red"}, "from_step": "failed"}, "filter.colour", "validation_error"),
        ({"from_step": "no such!"}, "from_step", "unknown_step"),
        ({"from_step": "failed", "per_second": 0}, "per_second", "validation_error"),
        ({"from_step": "failed", "per_second": 1000}, "per_second", "validation_error"),
        (
            {
                "filter": {"created_after": "2026-12-02T00:00:00Z", "created_before": "2026-12-01"},
                "from_step": "failed",
            },
            "filter.created_before",
            "invalid_filter",
        ),
    ],
)
def test_a_bad_rerun_is_422_naming_the_field(operator, body, field, code):
    failed_runs(1)

    for dry_run in (True, False):
        error = assert_error(operator.post("/reruns", {"reason": "r", "dry_run": dry_run, **body}), 422, code)
        assert field in error["detail"], error
    assert not Rerun.objects.exists()


def test_a_rerun_needs_a_reason(operator):
    error = assert_error(operator.post("/reruns", {"from_step": "failed"}), 422, "validation_error")
    assert "reason" in error["detail"]


def test_a_viewer_reads_reruns_but_may_not_start_or_abort_one(viewer, operator):
    failed_runs(1)
    job = operator.post("/reruns", {"from_step": "failed", "reason": "r"}).json()

    assert viewer.get("/reruns").status_code == 200
    assert_error(viewer.post("/reruns", {"from_step": "failed", "reason": "r", "dry_run": True}), 403, "forbidden")
    assert_error(viewer.post(f"/reruns/{job['id']}/abort", {"reason": "r"}), 403, "forbidden")
    assert Rerun.objects.get().status == "running"


def test_an_unknown_rerun_is_404(viewer, operator):
    assert_error(viewer.get(f"/reruns/{uuid.uuid4()}"), 404, "rerun_not_found")
    assert_error(operator.post(f"/reruns/{uuid.uuid4()}/abort", {"reason": "r"}), 404, "rerun_not_found")


def test_a_saved_view_selects_the_runs_it_shows_narrowed_by_the_reruns_own_fields(operator):
    failed_runs(3)
    failed_runs(2, name="other")
    view = operator.post("/views", {"name": "other fails", "filter": {"workflow": "other"}}).json()
    shown = operator.get(f"/views/{view['id']}/runs").json()["items"]

    preview = operator.post(
        "/reruns", {"filter": {"view": view["id"]}, "from_step": "failed", "reason": "r", "dry_run": True}
    ).json()
    assert preview["count"] == len(shown) == 2
    assert {plan["run_id"] for plan in preview["preview"]} == {run["id"] for run in shown}

    narrowed = operator.post(
        "/reruns", {"filter": {"view": view["id"], "workflow": "billing"}, "from_step": "failed", "reason": "r"}
    )
    assert narrowed.status_code == 201 and narrowed.json()["count"] == 0  # the view AND the workflow: none
    started = operator.post("/reruns", {"filter": {"view": str(view["id"])}, "from_step": "failed", "reason": "r"})
    assert started.status_code == 201 and started.json()["count"] == 2
    assert started.json()["filter"]["view"] == view["id"]


def test_a_view_the_caller_may_not_see_is_422_naming_it(operator, superuser):
    failed_runs(1)
    theirs = superuser.post("/views", {"name": "root's", "filter": {"workflow": "billing"}}).json()
    error = assert_error(
        operator.post("/reruns", {"filter": {"view": theirs["id"]}, "from_step": "failed", "reason": "r"}), 422
    )
    assert "filter.view" in error["detail"] and "not shared with you" in error["detail"]
    assert not Rerun.objects.exists()

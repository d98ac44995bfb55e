"""The pause calls of CONTRACT section 12: POST /pauses, GET /pauses, DELETE /pauses/{id} (a resume, paced when
per_second is given); who may; 422 naming the field, 404 for an unknown pause or run, 409 for a second pause."""

import uuid

import pytest

from runs.models import Pause
from tests.api.conftest import assert_error
from tests.helpers import echo_step, make_run, make_workflow

pytestmark = pytest.mark.django_db


def test_an_operator_pauses_a_dependency_and_the_list_shows_it(operator):
    response = operator.post("/pauses", {"scope": "dependency", "target": "email", "reason": "smtp outage"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["scope"] == "dependency" and body["target"] == "email" and body["reason"] == "smtp outage"
    assert body["by"] == "otto" and body["active"] is True and body["held"] == 0 and body["created_at"]
    listed = operator.get("/pauses").json()["items"]
    assert [item["id"] for item in listed] == [body["id"]]


def test_a_fleet_pause_needs_no_target_and_a_workflow_pause_names_one(operator):
    fleet = operator.post("/pauses", {"scope": "fleet", "reason": "deploy"})
    make_workflow(steps=[echo_step("a")], name="billing")
    workflow = operator.post("/pauses", {"scope": "workflow", "target": "billing", "reason": "bad prompt"})

    assert fleet.status_code == 201 and fleet.json()["target"] == "*"
    assert workflow.status_code == 201 and workflow.json()["target"] == "billing"


def test_a_second_pause_of_the_same_target_is_a_conflict(operator):
    operator.post("/pauses", {"scope": "dependency", "target": "webhook:hooks.example.com", "reason": "down"})

    again = operator.post("/pauses", {"scope": "dependency", "target": "webhook:hooks.example.com", "reason": "x"})

    assert "paused already" in assert_error(again, 409, "already_paused")["detail"]


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"scope": "planet", "target": "x", "reason": "r"}, "scope", "validation_error"),
        ({"scope": "dependency", "target": "ftp:files", "reason": "r"}, "target", "invalid_target"),
        ({"scope": "dependency", "target": "email"}, "reason", "validation_error"),
        ({"scope": "run", "target": "not-a-run-id", "reason": "r"}, "target", "invalid_target"),
        ({"scope": "fleet", "target": "everything", "reason": "r"}, "target", "invalid_target"),
        ({"scope": "fleet", "reason": "r", "extra": 1}, "extra", "validation_error"),
    ],
)
def test_a_bad_pause_is_422_naming_the_field(operator, body, field, code):
    error = assert_error(operator.post("/pauses", body), 422, code)

    assert field in error["detail"]
    assert not Pause.objects.exists()


def test_a_pause_of_an_unknown_run_or_workflow_is_404(operator):
    assert_error(
        operator.post("/pauses", {"scope": "run", "target": str(uuid.uuid4()), "reason": "r"}), 404, "run_not_found"
    )
    assert_error(
        operator.post("/pauses", {"scope": "workflow", "target": "nope", "reason": "r"}), 404, "workflow_not_found"
    )


def test_resuming_an_unknown_pause_is_404(operator):
    assert_error(operator.delete(f"/pauses/{uuid.uuid4()}", {"reason": "done"}), 404, "pause_not_found")


def test_a_resume_needs_a_reason_and_a_positive_pace(operator):
    pause = operator.post("/pauses", {"scope": "fleet", "reason": "deploy"}).json()

    no_reason = assert_error(operator.delete(f"/pauses/{pause['id']}", {}), 422, "validation_error")
    zero = assert_error(operator.delete(f"/pauses/{pause['id']}", {"reason": "ok", "per_second": 0}), 422)

    assert "reason" in no_reason["detail"] and "per_second" in zero["detail"]
    assert Pause.objects.get(id=pause["id"]).active


def test_a_resume_records_who_and_why_and_a_second_one_is_a_conflict(operator):
    pause = operator.post("/pauses", {"scope": "fleet", "reason": "deploy"}).json()

    resumed = operator.delete(f"/pauses/{pause['id']}", {"reason": "deployed", "per_second": 5})
    again = operator.delete(f"/pauses/{pause['id']}", {"reason": "again"})

    assert resumed.status_code == 200, resumed.content
    body = resumed.json()
    assert body["active"] is False and body["resumed_by"] == "otto" and body["resume_reason"] == "deployed"
    assert body["per_second"] == 5 and body["released"] == 0
    assert_error(again, 409, "pause_resumed")
    assert operator.get("/pauses", {"active": "false"}).json()["items"][0]["id"] == pause["id"]


def test_a_viewer_reads_pauses_but_may_not_make_one(viewer, operator):
    run = make_run()
    operator.post("/pauses", {"scope": "run", "target": str(run.id), "reason": "look"})

    assert viewer.get("/pauses").status_code == 200
    assert_error(viewer.post("/pauses", {"scope": "fleet", "reason": "x"}), 403, "forbidden")

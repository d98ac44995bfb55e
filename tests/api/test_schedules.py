"""The schedules calls of CONTRACT section 6: create, list, read, change, pause, resume and delete; who may; and
422 naming the field for a bad cron, timezone or workflow."""

from datetime import UTC, datetime

import pytest

from runs.models import Run, Schedule, ScheduleEvent
from runs.schedules import schedule_fire_due
from runs.services import workflow_create
from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db

BODY = {"workflow": "nightly", "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin", "input": {"team": "ops"}}


@pytest.fixture(autouse=True)
def nightly(db):
    workflow_create(
        definition={"name": "nightly", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )


def test_an_operator_creates_a_schedule_and_gets_its_next_fire_time(operator):
    response = operator.post("/schedules", {**BODY, "reason": "weekday report"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["workflow"] == "nightly" and body["cron"] == "0 9 * * 1-5" and body["timezone"] == "Europe/Berlin"
    assert body["enabled"] is True and body["catchup"] == "one" and body["input"] == {"team": "ops"}
    fire = datetime.fromisoformat(body["next_fire_at"]).astimezone(UTC)
    assert fire > datetime.now(UTC) and fire.minute == 0 and fire.hour in (7, 8)  # 09:00 in Berlin
    assert body["events"][0]["kind"] == "created" and body["events"][0]["by"] == "otto"
    assert body["events"][0]["reason"] == "weekday report"
    assert body["created_by"] == "otto"


def test_the_defaults_are_utc_enabled_and_catchup_one(operator):
    body = operator.post("/schedules", {"workflow": "nightly", "cron": "*/5 * * * *"}).json()
    assert (body["timezone"], body["enabled"], body["catchup"], body["input"]) == ("UTC", True, "one", {})


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"cron": "61 * * * *"}, "cron", "invalid_cron"),
        ({"cron": "* * *"}, "cron", "invalid_cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "invalid_timezone"),
        ({"workflow": "nope"}, "workflow", "workflow_not_found"),
    ],
)
def test_a_bad_cron_timezone_or_workflow_answers_422_naming_the_field(operator, change, field, code):
    body = assert_error(operator.post("/schedules", {**BODY, **change}), 422, code)
    assert body["detail"].startswith(f"{field}: ")
    assert not Schedule.objects.exists()


def test_a_bad_catchup_answers_422_naming_the_field(operator):
    body = assert_error(operator.post("/schedules", {**BODY, "catchup": "all"}), 422, "validation_error")
    assert body["errors"][0]["loc"] == "catchup"


def test_a_viewer_reads_schedules_but_cannot_create_one(operator, viewer):
    made = operator.post("/schedules", BODY).json()

    assert_error(viewer.post("/schedules", BODY), 403)
    listed = viewer.get("/schedules").json()["items"]
    assert [s["id"] for s in listed] == [made["id"]]
    assert viewer.get(f"/schedules/{made['id']}").json()["cron"] == "0 9 * * 1-5"
    assert_error(viewer.client.patch(f"/api/v1/schedules/{made['id']}", "{}", "application/json"), 401)


def test_anonymous_and_role_less_callers_are_refused(anonymous, nobody):
    assert_error(anonymous.get("/schedules"), 401)
    assert_error(nobody.get("/schedules"), 403)


def test_pause_and_resume_through_patch_are_recorded_with_who_and_why(operator):
    made = operator.post("/schedules", BODY).json()
    path = f"/api/v1/schedules/{made['id']}"
    headers = operator._headers(None)

    paused = operator.client.patch(path, {"enabled": False, "reason": "holiday"}, "application/json", headers=headers)
    resumed = operator.client.patch(path, {"enabled": True, "reason": "back"}, "application/json", headers=headers)

    assert paused.status_code == 200 and paused.json()["next_fire_at"] is None
    assert resumed.json()["enabled"] is True and resumed.json()["next_fire_at"] is not None
    kinds = [(e["kind"], e["by"], e["reason"]) for e in resumed.json()["events"]]
    assert kinds[:2] == [("resumed", "otto", "back"), ("paused", "otto", "holiday")]


def test_patch_changes_the_cron_and_refuses_a_bad_one(operator):
    made = operator.post("/schedules", BODY).json()
    path = f"/api/v1/schedules/{made['id']}"
    headers = operator._headers(None)

    changed = operator.client.patch(path, {"cron": "30 6 * * *"}, "application/json", headers=headers)
    refused = operator.client.patch(path, {"timezone": "Nowhere/Land"}, "application/json", headers=headers)

    assert changed.status_code == 200 and changed.json()["cron"] == "30 6 * * *"
    assert assert_error(refused, 422, "invalid_timezone")["detail"].startswith("timezone: ")
    assert Schedule.objects.get(id=made["id"]).timezone == "Europe/Berlin"


def test_delete_removes_the_schedule_and_keeps_its_history(operator):
    made = operator.post("/schedules", BODY).json()

    response = operator.method("DELETE", f"/schedules/{made['id']}?reason=retired")

    assert response.status_code == 204
    assert_error(operator.get(f"/schedules/{made['id']}"), 404, "schedule_not_found")
    assert ScheduleEvent.objects.filter(schedule_id=made["id"], kind="deleted", by="otto", reason="retired").exists()


def test_a_schedule_lists_the_runs_its_fires_made(operator):
    made = operator.post("/schedules", {"workflow": "nightly", "cron": "* * * * *"}).json()
    fire = datetime.fromisoformat(made["next_fire_at"])

    schedule_fire_due(now=fire.replace(second=5))

    body = operator.get(f"/schedules/{made['id']}").json()
    run = Run.objects.get()
    assert run.idempotency_key == f"schedule:{made['id']}:{fire.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    assert [(r["run_id"], r["status"]) for r in body["recent_runs"]] == [(str(run.id), "queued")]
    assert operator.get("/schedules").json()["items"][0]["recent_runs"][0]["run_id"] == str(run.id)


def test_an_unknown_schedule_answers_404(viewer):
    assert_error(viewer.get("/schedules/00000000-0000-0000-0000-000000000000"), 404, "schedule_not_found")
    assert_error(viewer.get("/schedules/not-a-uuid"), 422)

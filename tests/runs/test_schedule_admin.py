"""The admin's schedules: listed read-only, paused / resumed / deleted through runs.schedules (recorded with the
admin's name), and their history read-only."""

import pytest
from django.contrib.auth.models import User

from runs.models import Schedule, ScheduleEvent
from runs.schedules import schedule_create
from runs.services import workflow_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw"))
    return client


@pytest.fixture
def schedule(db) -> Schedule:
    workflow_create(
        definition={"name": "nightly", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )
    return schedule_create(workflow="nightly", cron="30 2 * * *", timezone_name="Europe/Berlin", by="otto")


def test_the_schedule_list_and_page_are_read_only(admin_client, schedule):
    assert "30 2 * * *" in admin_client.get("/admin/runs/schedule/").content.decode()
    page = admin_client.get(f"/admin/runs/schedule/{schedule.id}/change/").content.decode()
    assert "Europe/Berlin" in page and 'name="_save"' not in page
    assert admin_client.get("/admin/runs/schedule/add/").status_code == 403


def test_pause_and_resume_actions_go_through_the_service_with_the_admins_name(admin_client, schedule):
    selected = {"_selected_action": [str(schedule.id)]}
    admin_client.post("/admin/runs/schedule/", {"action": "pause_schedules", **selected})
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.next_fire_at is None

    admin_client.post("/admin/runs/schedule/", {"action": "resume_schedules", **selected})
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.next_fire_at is not None
    kinds = list(ScheduleEvent.objects.filter(by="alice").order_by("id").values_list("kind", flat=True))
    assert kinds == ["paused", "resumed"]


def test_deleting_in_the_admin_is_recorded(admin_client, schedule):
    admin_client.post(f"/admin/runs/schedule/{schedule.id}/delete/", {"post": "yes"})
    assert not Schedule.objects.exists()
    assert ScheduleEvent.objects.filter(schedule_id=schedule.id, kind="deleted", by="alice").exists()
    assert admin_client.get("/admin/runs/scheduleevent/").status_code == 200

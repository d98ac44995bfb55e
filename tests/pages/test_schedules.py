"""/schedules/: the list with each schedule's next fire time and the last runs it made; create, pause, resume and
delete with a reason, recorded with who; readers read; everyone must log in."""

from datetime import UTC, datetime

import pytest

from runs.models import Run, Schedule, ScheduleEvent
from runs.schedules import schedule_create, schedule_fire_due
from runs.services import workflow_create

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def nightly(db):
    workflow_create(
        definition={"name": "nightly", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )


def berlin_daily() -> Schedule:
    return schedule_create(
        workflow="nightly",
        cron="30 2 * * *",
        timezone_name="Europe/Berlin",
        by="otto",
        now=datetime(2026, 6, 1, 12, tzinfo=UTC),
    )


def test_the_list_shows_the_next_fire_time_in_its_zone_and_the_runs_it_made(viewer):
    schedule = berlin_daily()
    schedule_fire_due(now=datetime(2026, 6, 2, 0, 30, 5, tzinfo=UTC))  # 02:30 CEST on 2 June
    run = Run.objects.get()

    page = viewer.get("/schedules/").content.decode()

    assert "30 2 * * *" in page and "Europe/Berlin" in page
    assert "2026-06-03 02:30 CEST" in page and "2026-06-03 00:30 UTC" in page  # next fire, local and UTC
    assert f"/runs/{run.id}/" in page and "2026-06-02 00:30 UTC" in page
    assert f"/schedules/{schedule.id}/pause/" not in page  # a reader has no action buttons
    assert "needs the operator permission" in page


def test_an_operator_creates_a_schedule_from_the_form(operator):
    response = operator.post(
        "/schedules/",
        {
            "workflow": "nightly",
            "cron": "0 9 * * 1-5",
            "timezone": "Europe/Berlin",
            "input": '{"a": 1}',
            "catchup": "none",
            "reason": "weekday report",
        },
    )

    assert response.status_code == 302 and response["Location"] == "/schedules/"
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.catchup, schedule.input) == (
        "0 9 * * 1-5",
        "Europe/Berlin",
        "none",
        {"a": 1},
    )
    assert ScheduleEvent.objects.filter(kind="created", by="otto", reason="weekday report").exists()


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("cron", "every day", "cron: "),
        ("timezone", "Moon/Base", "timezone: "),
        ("workflow", "nope", "workflow: "),
        ("input", "[1, 2]", "input: must be a JSON object"),
    ],
)
def test_a_bad_field_answers_the_form_again_with_422_naming_it(operator, field, value, shown):
    fields = {"workflow": "nightly", "cron": "* * * * *", "timezone": "UTC", "input": "", "catchup": "one"}
    response = operator.post("/schedules/", {**fields, field: value})

    assert response.status_code == 422
    assert shown in response.content.decode()
    assert not Schedule.objects.exists()


def test_pause_resume_and_delete_are_recorded_with_who_and_why(operator):
    schedule = berlin_daily()
    base = f"/schedules/{schedule.id}"

    assert operator.post(f"{base}/pause/", {"reason": "holiday"}).status_code == 302
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.next_fire_at is None
    assert "paused" in operator.get("/schedules/").content.decode()

    operator.post(f"{base}/resume/", {"reason": "back"})
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.next_fire_at is not None

    operator.post(f"{base}/delete/", {"reason": "retired"})
    assert not Schedule.objects.exists()
    history = list(ScheduleEvent.objects.order_by("id").values_list("kind", "by", "reason"))
    assert history == [
        ("created", "otto", ""),
        ("paused", "otto", "holiday"),
        ("resumed", "otto", "back"),
        ("deleted", "otto", "retired"),
    ]


def test_a_reader_cannot_act_and_an_anonymous_visitor_must_log_in(viewer, anonymous):
    schedule = berlin_daily()

    assert viewer.post(f"/schedules/{schedule.id}/pause/", {"reason": "x"}).status_code == 403
    assert viewer.post("/schedules/", {"workflow": "nightly", "cron": "* * * * *"}).status_code == 403
    assert viewer.get(f"/schedules/{schedule.id}/pause/").status_code == 405  # actions are POST only
    assert anonymous.get("/schedules/").status_code == 302
    assert Schedule.objects.get().enabled


def test_an_unknown_action_or_schedule_answers_404(operator):
    schedule = berlin_daily()
    assert operator.post(f"/schedules/{schedule.id}/explode/").status_code == 404
    assert operator.post("/schedules/00000000-0000-0000-0000-000000000000/pause/").status_code == 404

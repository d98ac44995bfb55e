"""Schedules fired with a clock the test moves (schedule_fire_due(now=...)): one run per fire time, two beats
at once make one run, catch-up "one" / "none" after the scheduler was down, and Europe/Berlin's DST changes."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from journal.models import JournalEvent
from runs.models import Run, Schedule, ScheduleEvent
from runs.schedules import (
    ScheduleInvalid,
    fire_key,
    schedule_create,
    schedule_delete,
    schedule_fire_due,
    schedule_pause,
    schedule_resume,
    schedule_update,
)
from runs.services import workflow_create

pytestmark = pytest.mark.django_db


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def nightly():
    return workflow_create(
        definition={"name": "nightly", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )


def every_minute(*, now: datetime, catchup: str = "one", **kwargs) -> Schedule:
    nightly()
    return schedule_create(workflow="nightly", cron="* * * * *", catchup=catchup, by="otto", now=now, **kwargs)


def runs_of(schedule: Schedule) -> list[Run]:
    return list(Run.objects.filter(idempotency_key__startswith=f"schedule:{schedule.id}:").order_by("created_at"))


def fire_times(schedule: Schedule) -> list[datetime]:
    return list(
        ScheduleEvent.objects.filter(schedule_id=schedule.id, kind="fired")
        .order_by("fire_at")
        .values_list("fire_at", flat=True)
    )


def test_each_fire_time_makes_exactly_one_run_under_the_contracts_key():
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    assert schedule.next_fire_at == at("2026-06-01T10:01:00")

    first = schedule_fire_due(now=at("2026-06-01T10:01:04"))
    again = schedule_fire_due(now=at("2026-06-01T10:01:40"))  # the same minute: nothing new is due
    second = schedule_fire_due(now=at("2026-06-01T10:02:01"))

    assert [len(first), len(again), len(second)] == [1, 0, 1]
    runs = runs_of(schedule)
    assert [r.idempotency_key for r in runs] == [
        f"schedule:{schedule.id}:2026-06-01T10:01:00Z",
        f"schedule:{schedule.id}:2026-06-01T10:02:00Z",
    ]
    assert runs[0].created_by == f"schedule:{schedule.id}" and runs[0].status == "queued"
    fired = JournalEvent.objects.get(run_id=runs[0].id, kind="schedule_fired")
    assert fired.payload["schedule_id"] == str(schedule.id)
    assert fired.payload["fire_at"] == "2026-06-01T10:01:00+00:00"
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at("2026-06-01T10:03:00")
    assert schedule.last_fired_at == at("2026-06-01T10:02:00")


def test_a_fire_time_fired_again_returns_the_run_it_made():
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    schedule_fire_due(now=at("2026-06-01T10:01:02"))
    # A beat that read the schedule before the fire committed and retries it (or an operator's edit that moved
    # next_fire_at back): the Idempotency-Key answers with the run already made.
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=at("2026-06-01T10:01:00"))

    assert schedule_fire_due(now=at("2026-06-01T10:01:30")) == []
    assert len(runs_of(schedule)) == 1
    assert fire_times(schedule) == [at("2026-06-01T10:01:00")]


@pytest.mark.integration  # two connections at once and a Redis broker for the runs' tasks: Postgres and Redis
@pytest.mark.django_db(transaction=True)
def test_two_beats_firing_at_the_same_moment_make_one_run(redis_broker):
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    start = threading.Barrier(2)
    made: list[int] = []
    errors: list[BaseException] = []

    def beat():
        try:
            start.wait(5)
            made.append(len(schedule_fire_due(now=at("2026-06-01T10:01:03"), by=threading.current_thread().name)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=beat, name=f"beat-{n}") for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert sorted(made) == [0, 1]
    assert [r.idempotency_key for r in runs_of(schedule)] == [fire_key(schedule.id, at("2026-06-01T10:01:00"))]


def test_catchup_one_makes_one_run_for_the_fires_missed_while_the_scheduler_was_down():
    schedule = every_minute(now=at("2026-06-01T10:00:30"), catchup="one")

    fired = schedule_fire_due(now=at("2026-06-01T10:05:20"))  # down from 10:00:30 to 10:05:20

    assert [e.fire_at for e in fired] == [at("2026-06-01T10:05:00")]
    assert len(runs_of(schedule)) == 1
    skipped = ScheduleEvent.objects.get(schedule_id=schedule.id, kind="skipped")
    assert skipped.payload["count"] == 4 and skipped.payload["first"] == "2026-06-01T10:01:00+00:00"
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at("2026-06-01T10:06:00")
    assert len(schedule_fire_due(now=at("2026-06-01T10:06:02"))) == 1  # and on as usual


def test_catchup_none_skips_the_fires_missed_while_the_scheduler_was_down():
    schedule = every_minute(now=at("2026-06-01T10:00:30"), catchup="none")

    assert schedule_fire_due(now=at("2026-06-01T10:05:40")) == []  # 10:05 is 40 s late: missed too
    assert runs_of(schedule) == []
    assert ScheduleEvent.objects.get(schedule_id=schedule.id, kind="skipped").payload["count"] == 5
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at("2026-06-01T10:06:00")

    fired = schedule_fire_due(now=at("2026-06-01T10:06:05"))  # back up: the next fire is on time
    assert [e.fire_at for e in fired] == [at("2026-06-01T10:06:00")]


def test_catchup_none_still_fires_a_fire_time_a_beat_reaches_a_little_late():
    schedule = every_minute(now=at("2026-06-01T10:00:30"), catchup="none")
    assert len(schedule_fire_due(now=at("2026-06-01T10:01:20"))) == 1  # 20 s late: within GRACE
    assert len(runs_of(schedule)) == 1


def walk(schedule: Schedule, start: str, end: str, step_minutes: int = 5) -> list[datetime]:
    """Play the beat every `step_minutes` from start to end; the fire times made, in UTC."""
    now, stop = at(start), at(end)
    while now <= stop:
        schedule_fire_due(now=now)
        now += timedelta(minutes=step_minutes)
    return fire_times(schedule)


def test_a_daily_time_inside_the_spring_forward_gap_fires_once_just_after_it():
    nightly()
    # Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that night.
    schedule = schedule_create(
        workflow="nightly", cron="30 2 * * *", timezone_name="Europe/Berlin", by="otto", now=at("2026-03-27T12:00")
    )

    fired = walk(schedule, "2026-03-27T23:00", "2026-03-30T03:00", step_minutes=10)

    assert fired == [
        at("2026-03-28T01:30"),  # 02:30 CET
        at("2026-03-29T01:00"),  # 03:00 CEST, the first instant after the gap
        at("2026-03-30T00:30"),  # 02:30 CEST
    ]


def test_an_hourly_cron_skips_the_hour_that_spring_forward_removes():
    nightly()
    schedule = schedule_create(
        workflow="nightly", cron="0 * * * *", timezone_name="Europe/Berlin", by="otto", now=at("2026-03-28T23:30")
    )
    fired = walk(schedule, "2026-03-28T23:30", "2026-03-29T02:30")
    assert fired == [at("2026-03-29T00:00"), at("2026-03-29T01:00"), at("2026-03-29T02:00")]  # 01:00, 03:00, 04:00


def test_a_daily_time_in_the_hour_fall_back_repeats_fires_once():
    nightly()
    # Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice (00:30 and 01:30 UTC).
    schedule = schedule_create(
        workflow="nightly", cron="30 2 * * *", timezone_name="Europe/Berlin", by="otto", now=at("2026-10-24T12:00")
    )

    fired = walk(schedule, "2026-10-24T23:00", "2026-10-26T02:00", step_minutes=10)

    assert fired == [at("2026-10-25T00:30"), at("2026-10-26T01:30")]
    assert len(runs_of(schedule)) == 2


def test_an_hourly_cron_fires_in_both_hours_that_fall_back_repeats():
    nightly()
    schedule = schedule_create(
        workflow="nightly", cron="0 * * * *", timezone_name="Europe/Berlin", by="otto", now=at("2026-10-24T23:30")
    )
    fired = walk(schedule, "2026-10-24T23:30", "2026-10-25T02:30")
    assert fired == [at("2026-10-25T00:00"), at("2026-10-25T01:00"), at("2026-10-25T02:00")]  # 02:00, 02:00, 03:00


def test_a_paused_schedule_does_not_fire_and_a_resume_does_not_catch_up_the_pause():
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    schedule_pause(schedule_id=schedule.id, by="otto", reason="maintenance")
    assert schedule_fire_due(now=at("2026-06-01T10:03:05")) == []

    resumed = schedule_resume(schedule_id=schedule.id, by="otto", reason="done", now=at("2026-06-01T10:03:10"))

    assert resumed.next_fire_at == at("2026-06-01T10:04:00")
    kinds = list(
        ScheduleEvent.objects.filter(schedule_id=schedule.id).order_by("id").values_list("kind", "by", "reason")
    )
    assert kinds == [("created", "otto", ""), ("paused", "otto", "maintenance"), ("resumed", "otto", "done")]


def test_a_new_cron_starts_from_the_next_fire_time_after_now():
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    changed = schedule_update(
        schedule_id=schedule.id, changes={"cron": "0 12 * * *"}, by="otto", now=at("2026-06-01T10:00:40")
    )
    assert changed.next_fire_at == at("2026-06-01T12:00")
    event = ScheduleEvent.objects.get(schedule_id=schedule.id, kind="updated")
    assert event.payload["changed"] == {"cron": "0 12 * * *"}


def test_a_deleted_schedule_keeps_its_runs_and_its_history():
    schedule = every_minute(now=at("2026-06-01T10:00:30"))
    schedule_fire_due(now=at("2026-06-01T10:01:01"))
    schedule_delete(schedule_id=schedule.id, by="otto", reason="not needed")

    assert not Schedule.objects.filter(id=schedule.id).exists()
    assert len(runs_of(schedule)) == 1
    assert ScheduleEvent.objects.filter(schedule_id=schedule.id, kind="deleted", reason="not needed").exists()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"timezone_name": "Mars/Olympus"}, "timezone"),
        ({"timezone_name": "../etc/passwd"}, "timezone"),
        ({"workflow": "nope"}, "workflow"),
        ({"version": 9}, "version"),
        ({"catchup": "all"}, "catchup"),
    ],
)
def test_a_bad_field_is_refused_naming_it(values, field):
    nightly()
    with pytest.raises(ScheduleInvalid) as refused:
        schedule_create(**{"workflow": "nightly", "cron": "* * * * *", "by": "otto", **values})
    assert refused.value.field == field and refused.value.detail.startswith(f"{field}: ")
    assert refused.value.status == 422


def test_a_fire_whose_workflow_version_is_gone_is_recorded_and_the_schedule_goes_on():
    schedule = every_minute(now=at("2026-06-01T10:00:30"), version=1)
    Schedule.objects.filter(id=schedule.id).update(workflow_version=7)  # a version that does not exist

    assert schedule_fire_due(now=at("2026-06-01T10:01:02")) == []
    failed = ScheduleEvent.objects.get(schedule_id=schedule.id, kind="fire_failed")
    assert failed.payload["code"] == "workflow_not_found"
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at("2026-06-01T10:02:00")


def test_a_schedule_that_cannot_fire_does_not_stop_the_others():
    broken = every_minute(now=at("2026-06-01T10:00:30"))
    healthy = schedule_create(workflow="nightly", cron="* * * * *", by="otto", now=at("2026-06-01T10:00:30"))
    Schedule.objects.filter(id=broken.id).update(timezone="Gone/Zone")  # as if tzdata dropped it

    fired = schedule_fire_due(now=at("2026-06-01T10:01:02"))

    assert [e.schedule_id for e in fired] == [healthy.id]
    broken.refresh_from_db()
    assert broken.next_fire_at == at("2026-06-01T10:01:00")  # left as it was: the next tick tries again

"""Schedules (docs/reference/api.md, "Schedules"): a cron in an IANA timezone that starts runs of a workflow."""

# Firing: the beat's `runs.tasks.schedules_fire` calls schedule_fire_due. For each due schedule one conditional
# UPDATE (next_fire_at still what this beat read) decides which beat fires it; in the same transaction the fire
# makes its run through runs.services.run_create with the Idempotency-Key `schedule:{id}:{fire time}`, so two
# beats, a retried task or a crash between the two writes still make one run per fire time.
#
# Catch-up: fires that came due while no scheduler ran are made once, as one run for the latest of them
# ("one"), or skipped ("none"; a fire at most GRACE late is on time, not missed). Either way the skipped fire
# times are recorded (ScheduleEvent "skipped").
#
# Time: croniter walks the cron in the schedule's zone (tz-aware). Across a spring-forward gap a wall time that
# does not exist fires at the first instant after the gap (croniter's rule); across a fall-back a wall time that
# repeats fires once, at its first occurrence, unless the cron's hour field is a wildcard (an hourly or
# every-minute cron fires in both hours: they are different hours of real time). That is Vixie cron's rule.
#
# An operator's action (create, update, pause, resume, delete) is a ScheduleEvent with who and why: a schedule
# has no run to journal on. Each run a fire makes journals `schedule_fired` (which schedule, which fire time).

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from django.db import DatabaseError, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from journal.services import event_append
from pal.clock import db_now

from .errors import NotFound, ServiceError
from .models import Run, Schedule, ScheduleCatchup, ScheduleEvent
from .services import run_create, workflow_get

# catchup "none": a fire this late is on time (the beat ticks every 10 s, pal/settings.py), not missed.
GRACE = timedelta(seconds=30)
BATCH = 500  # due schedules one beat fires per tick; the rest are due at the next tick

log = logging.getLogger("pal.schedules")

EDITABLE = ("workflow", "version", "cron", "timezone", "input", "enabled", "catchup")


class ScheduleInvalid(ServiceError):
    """A bad field of a schedule: 422, the detail starting with the field's name."""

    status = 422

    def __init__(self, field_name: str, detail: str, *, code: str):
        super().__init__(f"{field_name}: {detail}", code=code)
        self.field = field_name


# --- the time arithmetic ---------------------------------------------------------------------------


def zone_check(name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ScheduleInvalid("timezone", "must be an IANA timezone name, e.g. Europe/Berlin", code="invalid_timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleInvalid(
            "timezone", f"{name!r} is not an IANA timezone (e.g. UTC, Europe/Berlin)", code="invalid_timezone"
        ) from None


def cron_check(cron: Any, zone: ZoneInfo) -> str:
    """Five fields (minute hour day month weekday) that croniter reads and that fire at least once."""
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ScheduleInvalid(
            "cron", f"{cron!r} is not 5 fields (minute hour day-of-month month day-of-week)", code="invalid_cron"
        )
    cron = " ".join(cron.split())
    try:
        croniter(cron, datetime.now(zone)).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleInvalid("cron", f"{cron!r} never fires", code="invalid_cron") from None
    except (CroniterError, ValueError, KeyError):
        raise ScheduleInvalid("cron", f"{cron!r} is not a valid cron expression", code="invalid_cron") from None
    return cron


def _hour_is_wildcard(cron: str) -> bool:
    return cron.split()[1].startswith("*")


def _second_of_repeated(local: datetime) -> bool:
    """The second occurrence of a wall time that a fall-back repeats."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def fire_times(*, cron: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """The fire times (UTC) strictly after `after`, in order, with the DST rule of the module's docstring."""
    walk = croniter(cron, after.astimezone(zone))
    skip_repeats = not _hour_is_wildcard(cron)
    while True:
        at = walk.get_next(datetime).astimezone(UTC)
        if skip_repeats and _second_of_repeated(at.astimezone(zone)):
            continue
        yield at


def next_fire_after(schedule: Schedule, after: datetime) -> datetime:
    return next(fire_times(cron=schedule.cron, zone=ZoneInfo(schedule.timezone), after=after))


def fire_key(schedule_id, fire_at: datetime) -> str:
    """The contract's Idempotency-Key of a fire: `schedule:{id}:{fire time as ISO UTC}` (seconds, "Z")."""
    return f"schedule:{schedule_id}:{fire_at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


# --- reads -----------------------------------------------------------------------------------------


def schedule_get(*, schedule_id) -> Schedule:
    schedule = Schedule.objects.filter(id=schedule_id).first()
    if schedule is None:
        raise NotFound(f"schedule {schedule_id} does not exist", code="schedule_not_found")
    return schedule


def schedule_list() -> list[Schedule]:
    return list(Schedule.objects.all())


@dataclass
class ScheduledRun:
    fire_at: datetime
    run_id: Any
    status: str  # the run's status, or "deleted"


def schedule_recent_runs(*, schedule_ids: list, limit: int = 5) -> dict[Any, list[ScheduledRun]]:
    """The last `limit` runs each schedule made, newest first, by schedule id: two queries for any number."""
    newest_first = Window(RowNumber(), partition_by=F("schedule_id"), order_by=F("id").desc())
    fired = (
        ScheduleEvent.objects.filter(schedule_id__in=schedule_ids, kind="fired", run_id__isnull=False)
        .annotate(rank=newest_first)
        .filter(rank__lte=limit)
        .order_by("schedule_id", "rank")
    )
    events = list(fired)
    statuses = dict(Run.objects.filter(id__in=[e.run_id for e in events if e.run_id]).values_list("id", "status"))
    recent: dict[Any, list[ScheduledRun]] = {sid: [] for sid in schedule_ids}
    for e in events:
        if e.fire_at and e.run_id:
            recent[e.schedule_id].append(ScheduledRun(e.fire_at, e.run_id, statuses.get(e.run_id, "deleted")))
    return recent


def schedule_events(*, schedule_id, limit: int = 20) -> list[ScheduleEvent]:
    return list(ScheduleEvent.objects.filter(schedule_id=schedule_id).order_by("-id")[:limit])


# --- an operator's actions -------------------------------------------------------------------------


def _checked(values: dict) -> dict:
    """The fields of a schedule, checked; each problem raises ScheduleInvalid naming its field."""
    zone = zone_check(values.get("timezone", "UTC"))
    cron = cron_check(values.get("cron"), zone)
    workflow, version = values.get("workflow"), values.get("version")
    if not isinstance(workflow, str) or not workflow:
        raise ScheduleInvalid("workflow", "must name a workflow", code="workflow_not_found")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise ScheduleInvalid("version", "must be a version number (1, 2, ...)", code="invalid_version")
    try:
        workflow_get(name=workflow, version=version)
    except NotFound as exc:
        raise ScheduleInvalid("workflow" if version is None else "version", exc.detail, code=exc.code) from None
    input = values.get("input") or {}
    if not isinstance(input, dict):
        raise ScheduleInvalid("input", "must be a JSON object", code="invalid_input")
    catchup = values.get("catchup", ScheduleCatchup.ONE)
    if catchup not in ScheduleCatchup.values:
        raise ScheduleInvalid("catchup", 'must be "one" or "none"', code="invalid_catchup")
    enabled = values.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ScheduleInvalid("enabled", "must be true or false", code="invalid_enabled")
    return {
        "workflow_name": workflow,
        "workflow_version": version,
        "cron": cron,
        "timezone": zone.key,
        "input": input,
        "catchup": catchup,
        "enabled": enabled,
    }


def schedule_values(schedule: Schedule) -> dict:
    """The fields an operator sets, as a schedule's events record them and the API shows them."""
    return {
        "workflow": schedule.workflow_name,
        "version": schedule.workflow_version,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "input": schedule.input,
        "enabled": schedule.enabled,
        "catchup": schedule.catchup,
    }


def _record(schedule: Schedule, kind: str, *, by: str, reason: str = "", **payload) -> ScheduleEvent:
    return ScheduleEvent.objects.create(schedule_id=schedule.id, kind=kind, by=by, reason=reason, payload=payload)


def schedule_create(
    *,
    workflow: str,
    cron: str,
    timezone_name: str = "UTC",
    input: dict | None = None,
    enabled: bool = True,
    catchup: str = ScheduleCatchup.ONE,
    version: int | None = None,
    by: str,
    reason: str = "",
    now: datetime | None = None,
) -> Schedule:
    """A new schedule; its first fire time is the first after `now` (default: the clock)."""
    fields = _checked(
        {
            "workflow": workflow,
            "version": version,
            "cron": cron,
            "timezone": timezone_name,
            "input": input,
            "enabled": enabled,
            "catchup": catchup,
        }
    )
    with transaction.atomic():
        schedule = Schedule(**fields, created_by=by)
        schedule.next_fire_at = next_fire_after(schedule, now or db_now()) if schedule.enabled else None
        schedule.save()
        _record(schedule, "created", by=by, reason=reason, fields=schedule_values(schedule))
    return schedule


def schedule_update(
    *,
    schedule_id,
    changes: dict,
    by: str,
    reason: str = "",
    kind: str = "updated",
    now: datetime | None = None,
) -> Schedule:
    """Change some fields (EDITABLE). A new cron, timezone or a resume starts again from the next fire time
    after now (fires missed while paused are not caught up); a pause clears next_fire_at."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ScheduleInvalid(unknown[0], "is not a field of a schedule", code="unknown_field")
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(id=schedule_id).first()
        if schedule is None:
            raise NotFound(f"schedule {schedule_id} does not exist", code="schedule_not_found")
        before = schedule_values(schedule)
        fields = _checked({**before, **changes})
        changed = {name: value for name, value in {**before, **changes}.items() if before[name] != value}
        for name, value in fields.items():
            setattr(schedule, name, value)
        if not schedule.enabled:
            schedule.next_fire_at = None
        elif schedule.next_fire_at is None or {"cron", "timezone"} & set(changed):
            schedule.next_fire_at = next_fire_after(schedule, now or db_now())
        schedule.save()
        _record(schedule, kind, by=by, reason=reason, changed=changed)
    return schedule


def schedule_pause(*, schedule_id, by: str, reason: str = "") -> Schedule:
    return schedule_update(schedule_id=schedule_id, changes={"enabled": False}, by=by, reason=reason, kind="paused")


def schedule_resume(*, schedule_id, by: str, reason: str = "", now: datetime | None = None) -> Schedule:
    return schedule_update(
        schedule_id=schedule_id, changes={"enabled": True}, by=by, reason=reason, kind="resumed", now=now
    )


def schedule_delete(*, schedule_id, by: str, reason: str = "") -> None:
    """Delete the schedule; its events and the runs it made stay."""
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(id=schedule_id).first()
        if schedule is None:
            raise NotFound(f"schedule {schedule_id} does not exist", code="schedule_not_found")
        _record(schedule, "deleted", by=by, reason=reason, fields=schedule_values(schedule))
        schedule.delete()


# --- firing ----------------------------------------------------------------------------------------


@dataclass
class _Plan:
    fire_at: datetime | None  # the fire to make now, if any
    next_at: datetime  # the first fire time after now
    skipped: list[datetime] = field(default_factory=list)


def _plan(schedule: Schedule, now: datetime) -> _Plan:
    assert schedule.next_fire_at is not None
    due = [schedule.next_fire_at]
    for at in fire_times(cron=schedule.cron, zone=ZoneInfo(schedule.timezone), after=schedule.next_fire_at):
        if at > now:
            next_at = at
            break
        due.append(at)
    latest = due[-1]
    if schedule.catchup == ScheduleCatchup.NONE and now - latest > GRACE:
        return _Plan(fire_at=None, next_at=next_at, skipped=due)
    return _Plan(fire_at=latest, next_at=next_at, skipped=due[:-1])


def schedule_fire_due(*, now: datetime | None = None, by: str = "beat") -> list[ScheduleEvent]:
    """Fire every enabled schedule that is due at `now` (default: the database's clock, which every beat shares:
    pal.clock): the `fired` events it made."""
    now = now or db_now()
    due = Schedule.objects.filter(enabled=True, next_fire_at__lte=now).order_by("next_fire_at")[:BATCH]
    fired = []
    for schedule in due:
        try:
            event = _schedule_fire(schedule, now=now, by=by)
        except (DatabaseError, ZoneInfoNotFoundError, CroniterError):
            # One schedule that cannot fire (its zone left tzdata, the database failed under it) must not stop
            # the others; its transaction rolled back, so the next tick tries it again.
            log.exception("schedule %s could not fire", schedule.id)
            continue
        if event is not None:
            fired.append(event)
    return fired


def _schedule_fire(schedule: Schedule, *, now: datetime, by: str) -> ScheduleEvent | None:
    plan = _plan(schedule, now)
    with transaction.atomic():
        won = Schedule.objects.filter(id=schedule.id, enabled=True, next_fire_at=schedule.next_fire_at).update(
            next_fire_at=plan.next_at, last_fired_at=plan.fire_at or schedule.last_fired_at, updated_at=now
        )
        if won != 1:
            return None  # another beat fired it first, or an operator changed it since it was read
        if plan.skipped:
            _record(
                schedule,
                "skipped",
                by=by,
                count=len(plan.skipped),
                first=plan.skipped[0].isoformat(),
                last=plan.skipped[-1].isoformat(),
                catchup=schedule.catchup,
            )
        if plan.fire_at is None:
            return None
        return _fire(schedule, plan.fire_at, by=by)


def _fire(schedule: Schedule, fire_at: datetime, *, by: str) -> ScheduleEvent | None:
    """Make the fire's run, in the caller's transaction. A refusal (the workflow version is gone, the key was
    used with another input) is recorded as fire_failed: the schedule goes on with its next fire time."""
    key = fire_key(schedule.id, fire_at)
    try:
        run, created = run_create(
            workflow_name=schedule.workflow_name,
            version=schedule.workflow_version,
            input=schedule.input,
            idempotency_key=key,
            created_by=f"schedule:{schedule.id}",
        )
    except ServiceError as exc:
        _record(schedule, "fire_failed", by=by, fire_at=fire_at.isoformat(), code=exc.code, error=exc.detail)
        return None
    if not created:
        return None  # this fire time made its run before (its `fired` row is there)
    event_append(
        run_id=run.id,
        kind="schedule_fired",
        payload={
            "schedule_id": str(schedule.id),
            "fire_at": fire_at.astimezone(UTC).isoformat(),
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "key": key,
            "by": by,
        },
        writer=by,
    )
    return ScheduleEvent.objects.create(schedule_id=schedule.id, kind="fired", fire_at=fire_at, run_id=run.id, by=by)

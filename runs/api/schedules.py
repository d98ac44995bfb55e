"""The REST API's schedules calls (docs/reference/api.md): POST/GET /schedules, GET/PATCH/DELETE /schedules/{id}."""

# Reads need a viewer, changes an operator (tokens.auth), like the runs calls. Every change goes through
# runs.schedules and is recorded with who and why; a bad cron, timezone or workflow answers 422 naming the field.

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Router, Schema, Status

from tokens.auth import operator, viewer

from .. import schedules
from ..models import Schedule
from .schemas import NAME_PATTERN, ErrorOut, Strict

router = Router(tags=["schedules"])

READ = {code: ErrorOut for code in (401, 403, 404, 422)}
WRITE = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422)}

Catchup = Literal["one", "none"]


class ScheduleIn(Strict):
    workflow: str = Field(..., pattern=NAME_PATTERN, description="the workflow's name")
    version: int | None = Field(
        None, ge=1, description="a version of the workflow; the latest at each fire if left out"
    )
    cron: str = Field(
        ..., max_length=120, description='5 fields: minute hour day-of-month month day-of-week, e.g. "0 9 * * 1-5"'
    )
    timezone: str = Field(
        "UTC", max_length=64, description="IANA name, e.g. Europe/Berlin: the cron is read in its wall time"
    )
    input: dict[str, Any] = Field(default_factory=dict, description="the input of every run it makes")
    enabled: bool = True
    catchup: Catchup = Field(
        "one", description='"one": fires missed while no scheduler ran make one run; "none": skipped'
    )
    reason: str = Field("", max_length=2000, description="why (recorded with your name)")


class SchedulePatch(Strict):
    workflow: str | None = Field(None, pattern=NAME_PATTERN)
    version: int | None = Field(None, ge=1)
    cron: str | None = Field(None, max_length=120)
    timezone: str | None = Field(None, max_length=64)
    input: dict[str, Any] | None = None
    enabled: bool | None = Field(None, description="false pauses it; true resumes it from the next fire time")
    catchup: Catchup | None = None
    reason: str = Field("", max_length=2000, description="why (recorded with your name)")


class ScheduledRunOut(Schema):
    run_id: UUID
    fire_at: datetime
    status: str = Field(..., description='the run\'s status ("deleted" if the run is gone)')


class ScheduleEventOut(Schema):
    kind: str = Field(..., description="created, updated, paused, resumed, deleted, fired, skipped, fire_failed")
    by: str
    reason: str
    fire_at: datetime | None
    run_id: UUID | None
    payload: dict[str, Any]
    created_at: datetime


class ScheduleOut(Schema):
    id: UUID
    workflow: str
    version: int | None
    cron: str
    timezone: str
    input: dict[str, Any]
    enabled: bool
    catchup: Catchup
    next_fire_at: datetime | None = Field(..., description="null while paused")
    last_fired_at: datetime | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    recent_runs: list[ScheduledRunOut] = Field(..., description="the last runs it made, newest first")


class ScheduleDetailOut(ScheduleOut):
    events: list[ScheduleEventOut] = Field(..., description="what happened to it, newest first: who, why, fires")


class ScheduleListOut(Schema):
    items: list[ScheduleOut]


def _by(request) -> str:
    return request.auth.get_username()


def _out(schedule: Schedule, recent: list) -> dict:
    return {
        "id": schedule.id,
        **schedules.schedule_values(schedule),
        "next_fire_at": schedule.next_fire_at,
        "last_fired_at": schedule.last_fired_at,
        "created_by": schedule.created_by,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
        "recent_runs": [{"run_id": r.run_id, "fire_at": r.fire_at, "status": r.status} for r in recent],
    }


def _detail(schedule: Schedule) -> dict:
    recent = schedules.schedule_recent_runs(schedule_ids=[schedule.id], limit=10)[schedule.id]
    events = [
        {
            "kind": e.kind,
            "by": e.by,
            "reason": e.reason,
            "fire_at": e.fire_at,
            "run_id": e.run_id,
            "payload": e.payload,
            "created_at": e.created_at,
        }
        for e in schedules.schedule_events(schedule_id=schedule.id)
    ]
    return {**_out(schedule, recent), "events": events}


@router.post(
    "/schedules",
    auth=operator,
    response={201: ScheduleDetailOut, **WRITE},
    summary="Create a schedule: a cron in a timezone that starts runs of a workflow",
)
def schedule_post(request, body: ScheduleIn):
    schedule = schedules.schedule_create(
        workflow=body.workflow,
        version=body.version,
        cron=body.cron,
        timezone_name=body.timezone,
        input=body.input,
        enabled=body.enabled,
        catchup=body.catchup,
        by=_by(request),
        reason=body.reason,
    )
    return Status(201, _detail(schedule))


@router.get("/schedules", auth=viewer, response={200: ScheduleListOut, **READ}, summary="Every schedule")
def schedule_list(request):
    items = schedules.schedule_list()
    recent = schedules.schedule_recent_runs(schedule_ids=[s.id for s in items])
    return {"items": [_out(s, recent[s.id]) for s in items]}


@router.get(
    "/schedules/{id}",
    auth=viewer,
    response={200: ScheduleDetailOut, **READ},
    summary="One schedule, with its last runs and what happened to it",
)
def schedule_detail(request, id: UUID):
    return _detail(schedules.schedule_get(schedule_id=id))


@router.patch(
    "/schedules/{id}",
    auth=operator,
    response={200: ScheduleDetailOut, **WRITE},
    summary="Change a schedule (enabled: false pauses it, true resumes it)",
)
def schedule_patch(request, id: UUID, body: SchedulePatch):
    changes = body.model_dump(exclude_unset=True)
    reason = changes.pop("reason", "")
    if "timezone" in changes and changes["timezone"] is None:
        changes["timezone"] = "UTC"
    if changes.keys() == {"enabled"}:
        act = schedules.schedule_resume if changes["enabled"] else schedules.schedule_pause
        schedule = act(schedule_id=id, by=_by(request), reason=reason)
    else:
        schedule = schedules.schedule_update(schedule_id=id, changes=changes, by=_by(request), reason=reason)
    return _detail(schedule)


@router.delete(
    "/schedules/{id}",
    auth=operator,
    response={204: None, **WRITE},
    summary="Delete a schedule (the runs it made and its history stay)",
)
def schedule_remove(request, id: UUID, reason: str = ""):
    schedules.schedule_delete(schedule_id=id, by=_by(request), reason=reason)
    return Status(204, None)

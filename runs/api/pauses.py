"""The REST API's pause calls (docs/reference/api.md, "Pauses"): POST/GET /pauses, GET/DELETE /pauses/{id}."""

# Reads need a viewer, changes an operator (tokens.auth). A pause and its resume are recorded with who and why
# (runs.services.pauses); a bad scope, target or per_second answers 422 naming the field.

from datetime import datetime
from typing import Literal
from uuid import UUID

from ninja import Field, Router, Schema, Status

from tokens.auth import operator, viewer

from .. import services
from ..models import Pause
from .schemas import ErrorOut, Strict

router = Router(tags=["pauses"])

READ = {code: ErrorOut for code in (401, 403, 404, 422)}
WRITE = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422)}


class PauseIn(Strict):
    scope: Literal["run", "workflow", "dependency", "fleet"] = Field(..., description="what the pause holds")
    target: str = Field(
        "",
        max_length=255,
        description='a run id, a workflow name, `llm:MODEL` / `webhook:HOST` / `email`; "*" (or nothing) for fleet',
    )
    reason: str = Field(..., min_length=1, max_length=2000, description="why (recorded with your name)")


class ResumeIn(Strict):
    reason: str = Field(..., min_length=1, max_length=2000, description="why (recorded with your name)")
    per_second: float | None = Field(
        None, gt=0, le=1000, description="release the held runs (and a peer's calls) at most this many a second"
    )


class PauseOut(Schema):
    id: UUID
    scope: str
    target: str
    reason: str
    by: str
    created_at: datetime
    active: bool
    held: int = Field(..., description="the waiting runs it holds now")
    resumed_at: datetime | None
    resumed_by: str
    resume_reason: str
    per_second: float | None
    pace_until: datetime | None = Field(..., description="a paced dependency's calls keep to per_second until then")
    released: int | None = Field(None, description="on a resume: how many held runs it released")


class PauseListOut(Schema):
    items: list[PauseOut]


def _by(request) -> str:
    return request.auth.get_username()


def _out(pause: Pause, **more) -> dict:
    return {
        "id": pause.id,
        "scope": pause.scope,
        "target": pause.target,
        "reason": pause.reason,
        "by": pause.by,
        "created_at": pause.created_at,
        "active": pause.active,
        "held": services.pause_held_count(pause_id=pause.id),
        "resumed_at": pause.resumed_at,
        "resumed_by": pause.resumed_by,
        "resume_reason": pause.resume_reason,
        "per_second": pause.per_second,
        "pace_until": pause.pace_until,
        **more,
    }


@router.post(
    "/pauses",
    auth=operator,
    response={201: PauseOut, **WRITE},
    summary="Pause a run, a workflow, a dependency or the fleet: what it holds parks, holding no worker",
)
def pause_post(request, body: PauseIn):
    pause = services.pause_create(scope=body.scope, target=body.target, by=_by(request), reason=body.reason)
    pause.refresh_from_db()  # created_at is the database's clock
    return Status(201, _out(pause))


@router.get("/pauses", auth=viewer, response={200: PauseListOut, **READ}, summary="The pauses, active ones first")
def pause_list(request, active: bool | None = None):
    return {"items": [_out(pause) for pause in services.pause_list(active=active)]}


@router.get("/pauses/{id}", auth=viewer, response={200: PauseOut, **READ}, summary="One pause")
def pause_detail(request, id: UUID):
    return _out(services.pause_get(pause_id=id))


@router.delete(
    "/pauses/{id}",
    auth=operator,
    response={200: PauseOut, **WRITE},
    summary="Resume a pause: wake what it holds, per_second a second when given",
)
def pause_delete(request, id: UUID, body: ResumeIn):
    pause, released = services.pause_resume(
        pause_id=id, by=_by(request), reason=body.reason, per_second=body.per_second
    )
    return _out(pause, released=released)

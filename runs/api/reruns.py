"""The REST API's rerun calls (docs/reference/api.md, "Reruns"): POST/GET /reruns, GET /reruns/{id},
POST /reruns/{id}/abort."""

# Reads need a viewer, changes an operator (tokens.auth), checked before the body. The filter, from_step and
# per_second are read by runs.services.reruns, which names a bad field (`filter.status`, `from_step`) in its 422.

from datetime import datetime
from typing import Any
from uuid import UUID

from ninja import Field, Router, Schema, Status

from tokens.auth import operator, viewer

from .. import selectors, services
from ..models import Rerun
from .schemas import ErrorOut, Strict

router = Router(tags=["reruns"])

READ = {code: ErrorOut for code in (401, 403, 404, 422)}
WRITE = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422)}


class RerunFilterIn(Strict):
    workflow: str | None = Field(None, max_length=64, description="a workflow's name (any version)")
    status: str | None = Field(None, max_length=16, description="failed (the default), succeeded or cancelled")
    step_id: str | None = Field(None, max_length=64, description="the step the runs failed in")
    error_code: str | None = Field(None, max_length=100, description="the code of the runs' error")
    created_after: str | None = Field(None, max_length=64, description="ISO 8601, inclusive")
    created_before: str | None = Field(None, max_length=64, description="ISO 8601, exclusive")
    view: int | str | None = Field(None, description="a saved view's id (GET /views): its runs, narrowed by the rest")


class RerunIn(Strict):
    filter: RerunFilterIn | None = Field(None, description="which runs; every field optional")
    from_step: str = Field(..., max_length=80, description='"failed" (each run\'s failed step) or a step id')
    reason: str = Field(..., min_length=1, max_length=2000, description="why (journaled on each run with your name)")
    name: str = Field("", max_length=200, description="the incident it answers (default: the reason)")
    per_second: float | None = Field(None, gt=0, le=100, description="rerun at most this many runs a second")
    dry_run: bool = Field(False, description="answer the count and the preview; start nothing")


class AbortIn(Strict):
    reason: str = Field(..., min_length=1, max_length=2000, description="why (recorded with your name)")


class RefusalOut(Schema):
    run_id: UUID
    code: str
    detail: str


class RerunOut(Schema):
    id: UUID
    name: str
    filter: dict[str, Any]
    from_step: str
    reason: str
    by: str
    per_second: float | None
    status: str = Field(..., description="running, done or aborted")
    count: int = Field(..., description="the runs it covers, fixed at the start")
    done: int = Field(..., description="of them, rerun or refused so far")
    rerun: int = Field(..., description="of them, retried in place or forked")
    refused: int
    retried: int = Field(..., description="failed runs retried in place")
    forked: int = Field(..., description="ended runs forked into new runs")
    created_at: datetime
    finished_at: datetime | None
    aborted_by: str
    abort_reason: str
    refusals: list[RefusalOut] | None = Field(None, description="one rerun's refused runs (GET /reruns/{id})")


class RerunListOut(Schema):
    items: list[RerunOut]


class RerunPreviewOut(Schema):
    id: None = Field(None, description="a dry run makes no job")
    status: str = Field("dry_run")
    count: int = Field(..., description="the runs the filter selects now")
    done: int = 0
    limit: int
    too_many: bool = Field(..., description="more than `limit` runs: narrow the filter to start it")
    actions: dict[str, int] = Field(..., description="{retry: failed runs retried in place, fork: ended ones forked}")
    seconds: float | None = Field(..., description="how long at per_second")
    filter: dict[str, Any]
    from_step: str
    per_second: float | None
    preview: list[dict[str, Any]] = Field(
        ..., description="the first runs, oldest first: {run_id, status, action, reused, rerun, refused}"
    )


def _by(request) -> str:
    return request.auth.get_username()


def _out(rerun: Rerun, *, actions: dict[str, int] | None = None, refusals: bool = False) -> dict:
    if actions is None:
        actions = selectors.rerun_actions(rerun_ids=[rerun.id]).get(rerun.id, {})
    out = {
        field: getattr(rerun, field)
        for field in (
            "id",
            "name",
            "filter",
            "from_step",
            "reason",
            "by",
            "per_second",
            "status",
            "count",
            "done",
            "refused",
            "created_at",
            "finished_at",
            "aborted_by",
            "abort_reason",
        )
    }
    out.update(rerun=rerun.done - rerun.refused, retried=actions.get("retry", 0), forked=actions.get("fork", 0))
    if refusals:
        out["refusals"] = [
            {"run_id": item.run_id, "code": item.code, "detail": item.detail}
            for item in selectors.rerun_refusals(rerun_id=rerun.id)
        ]
    return out


@router.post(
    "/reruns",
    auth=operator,
    response={201: RerunOut, 200: RerunPreviewOut, **WRITE},
    summary="Re-run the runs a filter selects from their failed step or a step, paced; dry_run previews it",
)
def rerun_post(request, body: RerunIn):
    found = body.filter.model_dump(exclude_none=True) if body.filter is not None else {}
    if body.dry_run:
        return Status(
            200,
            services.rerun_preview(
                filter=found, from_step=body.from_step, per_second=body.per_second, user=request.auth
            ),
        )
    rerun = services.rerun_start(
        filter=found,
        from_step=body.from_step,
        reason=body.reason,
        by=_by(request),
        name=body.name,
        per_second=body.per_second,
        user=request.auth,
    )
    return Status(201, _out(rerun))


@router.get("/reruns", auth=viewer, response={200: RerunListOut, **READ}, summary="The reruns, running ones first")
def rerun_list(request):
    reruns = selectors.rerun_list()
    actions = selectors.rerun_actions(rerun_ids=[rerun.id for rerun in reruns])
    return {"items": [_out(rerun, actions=actions.get(rerun.id, {})) for rerun in reruns]}


@router.get("/reruns/{id}", auth=viewer, response={200: RerunOut, **READ}, summary="One rerun and its progress")
def rerun_detail(request, id: UUID):
    return _out(selectors.rerun_get(rerun_id=id), refusals=True)


@router.post(
    "/reruns/{id}/abort",
    auth=operator,
    response={200: RerunOut, **WRITE},
    summary="Abort a running rerun: the runs it has not reached are left as they are",
)
def rerun_abort(request, id: UUID, body: AbortIn):
    return _out(services.rerun_abort(rerun_id=id, by=_by(request), reason=body.reason), refusals=True)

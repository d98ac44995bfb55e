"""The REST API's saved views (docs/reference/api.md, "Saved views"): POST/GET /views, GET/DELETE /views/{id},
GET /views/{id}/runs."""

# Reads need a viewer, changes an operator (tokens.auth); a user sees the views it owns or shares a group with
# (runs.selectors.views). A view's runs are GET /runs's, paged the same way, its count counted live.

from datetime import datetime
from typing import Any

from ninja import Field, Path, Query, Router, Schema, Status

from tokens.auth import operator, viewer

from .. import selectors, services
from ..models import SavedView
from .runs import _rendered, run_summary
from .schemas import ErrorOut, RunListOut, Strict

router = Router(tags=["views"])

MAX_ID = 2**63 - 1
READ = {code: ErrorOut for code in (401, 403, 404, 422)}
WRITE = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422)}


class ViewIn(Strict):
    name: str = Field(..., min_length=1, max_length=100, description="unique among your views")
    filter: dict[str, Any] = Field(
        ...,
        description="GET /runs's filters: status, workflow, parent, stuck, q, input, created_after, created_before, "
        'error_code and attr.NAME, e.g. {"status": "failed", "attr.customer": "acme"}',
    )
    group: str | None = Field(None, max_length=150, description="share with this Django group (one of yours)")


class ViewOut(Schema):
    id: int
    name: str
    filter: dict[str, Any]
    owner: str
    group: str | None
    created_at: datetime
    count: int = Field(..., description=f"its runs now, counted up to {selectors.COUNT_SHOWN:,}")
    truncated: bool = Field(..., description="true: it has more runs than count")


class ViewListOut(Schema):
    items: list[ViewOut]


def _out(view: SavedView, user) -> dict:
    count, truncated = selectors.view_count(view=view, user=user)
    return {
        "id": view.id,
        "name": view.name,
        "filter": view.filter,
        "owner": view.owner.get_username(),
        "group": view.group.name if view.group else None,
        "created_at": view.created_at,
        "count": count,
        "truncated": truncated,
    }


@router.post("/views", auth=operator, response={201: ViewOut, **WRITE}, summary="Save a filter of the runs as a view")
def view_post(request, body: ViewIn):
    view = services.view_create(name=body.name, filter=body.filter, owner=request.auth, group=body.group)
    view.refresh_from_db()  # created_at is the database's clock
    return Status(201, _out(view, request.auth))


@router.get(
    "/views", auth=viewer, response={200: ViewListOut, **READ}, summary="Your views and your groups', with counts"
)
def view_list(request):
    return {"items": [_out(view, request.auth) for view in selectors.views_visible(user=request.auth)]}


@router.get("/views/{id}", auth=viewer, response={200: ViewOut, **READ}, summary="One view, with its count")
def view_detail(request, id: int = Path(..., ge=1, le=MAX_ID)):
    return _out(selectors.view_get(view_id=id, user=request.auth), request.auth)


@router.delete("/views/{id}", auth=operator, response={204: None, **WRITE}, summary="Delete one of your views")
def view_delete(request, id: int = Path(..., ge=1, le=MAX_ID)):
    services.view_delete(view_id=id, user=request.auth)
    return Status(204, None)


@router.get(
    "/views/{id}/runs",
    auth=viewer,
    response={200: RunListOut, **READ},
    summary="A view's runs, newest first, paged as GET /runs",
)
def view_runs(
    request,
    id: int = Path(..., ge=1, le=MAX_ID),
    limit: int = Query(50, ge=1, le=selectors.MAX_PAGE),
    cursor: str | None = Query(None, max_length=500),
):
    args = selectors.filter_args({"view": id}, user=request.auth)
    runs, next_cursor = selectors.run_list(**args, limit=limit, cursor=cursor) if args is not None else ([], None)
    return _rendered(request, {"items": [run_summary(run) for run in runs], "next_cursor": next_cursor}, status=200)

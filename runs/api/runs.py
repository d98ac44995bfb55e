"""The REST API's run calls (docs/reference/api.md), health and the receipt key. Each one reads through
runs.selectors or changes state through runs.services, like the admin and the pages; errors are raised as
ServiceError and answered by pal.api."""

import json
from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone
from ninja import Header, Query, Router, Status
from ninja.renderers import JSONRenderer

from journal.models import JournalEvent
from journal.receipts import KeyNotConfigured, key_id, receipt_public_key_pem
from journal.selectors import event_get, events_for_run
from journal.text import utf8_safe_json
from pal.db_threads import in_db_thread
from tokens.auth import TokenAuthWith, operator, viewer, viewer_async

from .. import attributes, compare, explain, receipts, search, selectors, services
from ..models import Run
from ..step_detail import step_detail
from ..streams import sse_events
from .receipt_schemas import ReceiptOut
from .schemas import (
    READ,
    WRITE,
    ApprovalIn,
    BatchIn,
    BatchOut,
    BudgetIn,
    CompareOut,
    EventIn,
    EventOut,
    EventPageOut,
    ForkIn,
    ForkPreviewIn,
    ForkPreviewOut,
    HealthOut,
    ReasonIn,
    RedriveIn,
    RedrivePreviewOut,
    RunIn,
    RunListOut,
    RunOut,
    RunStatusName,
    SignalIn,
    SignalOut,
    StepDetailOut,
    UnhealthyOut,
    WaterfallOut,
    errors,
)

router = Router()


def _by(request) -> str:
    return request.auth.get_username()


# --- runs -----------------------------------------------------------------------------------------


# What a run just created has in its journal: its run_created (an unsaved row; run_why reads only its kind).
JUST_CREATED = JournalEvent(kind="run_created")


def _lease_out(lease):
    return lease and {"owner": lease["owner"], "epoch": lease["epoch"], "expires_at": lease["expires_at"]}


_JSON = JSONRenderer()  # what pal.api's NinjaAPI renders with (its default)


def _rendered(request, data, *, status: int) -> HttpResponse:
    """The answer ninja makes of `data` validated against the route's schema, without that validation: for dicts
    that run_out makes with exactly the schema's fields and types (RunOut; tests compare the bytes)."""
    body = _JSON.render(request, data, response_status=status)
    return HttpResponse(body, status=status, content_type=f"{_JSON.media_type}; charset={_JSON.charset}")


def run_out(run: Run, *, booked_owner: str | None = None, booked_lease: dict | None = None) -> dict:
    """booked_owner: the booking this request made for a run it created. While the lease is still that booking
    nobody has taken the run, so its journal holds just run_created and `why` need not read it. booked_lease: that
    booking itself (run.booked_lease), answered as the run was at the request's commit, with no read. A run read by
    selectors.run_with_lease brings its last journal row along (run.last_event): `why` reads that one."""
    lease = booked_lease if booked_lease is not None else selectors.lease_of(run)
    fresh = booked_lease is not None or (
        booked_owner is not None and lease is not None and lease["owner"] == booked_owner
    )
    # The lease is judged by the database's clock (pal.clock): read with the run or its lease, or (a run this
    # request created) the clock its booking was made by; else run_why reads it.
    now = getattr(run, "db_now", None)
    now = now if isinstance(now, datetime) else (timezone.now() if booked_lease is not None else None)
    if fresh:
        why = explain.run_why(run, lease=lease, last=JUST_CREATED, now=now)
    elif hasattr(run, "last_event"):
        why = explain.run_why(run, lease=lease, last=run.last_event, now=now)
    else:
        why = explain.run_why(run, lease=lease, now=now)
    return {
        "id": run.id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "status": run.status,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "parent_run_id": run.parent_run_id,
        "parent_step_id": run.parent_step_id,
        "forked_from": run.forked_from_id,
        "depth": run.depth,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "lease": _lease_out(lease),
        "waiting_on": run.waiting_on,
        "why": why,
    }


def run_summary(run: Run) -> dict:
    return {
        "id": run.id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "status": run.status,
        "error": run.error,
        "parent_run_id": run.parent_run_id,
        "parent_step_id": run.parent_step_id,
        "depth": run.depth,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "lease": _lease_out(selectors.lease_of(run)),
        "waiting_on": run.waiting_on,
    }


@router.post(
    "/runs",
    auth=operator,
    tags=["runs"],
    response={201: RunOut, 200: RunOut, **WRITE},
    summary="Start a run (201); the same Idempotency-Key and body again: 200 and the same run",
)
def run_post(
    request,
    body: RunIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", min_length=1, max_length=200),
):
    # Keys are per user, so two clients that pick the same key never see each other's runs.
    key = f"api:{request.auth.pk}:{idempotency_key}" if idempotency_key else None
    run, created = services.run_create(
        workflow_name=body.workflow,
        input=body.input,
        version=body.version,
        idempotency_key=key,
        created_by=_by(request),
        priority=body.priority,
    )
    # A run it made is answered as its commit left it: status queued, the lease it booked (no read of the lease
    # after the commit: tests/api/test_create_path.py). Rendered without ninja's second validation, as GET
    # /runs/{id} (tests/api/test_batch_render.py compares bytes).
    out = run_out(run, booked_lease=run.booked_lease) if created else run_out(run)
    return _rendered(request, out, status=201 if created else 200)


# Before GET /runs/{id}: Django tries the addresses in order, and that one's {id} would match "batch".
@router.post(
    "/runs/batch",
    auth=operator,
    tags=["runs"],
    response={201: BatchOut, **WRITE},
    summary="Start up to 500 runs in one transaction, all or nothing (422 names the index of a bad one)",
)
def run_batch(request, body: BatchIn):
    # Keys are per user, as the Idempotency-Key header of POST /runs.
    items = [
        {**item.model_dump(), "idempotency_key": f"api:{request.auth.pk}:{item.idempotency_key}"}
        if item.idempotency_key
        else item.model_dump()
        for item in body.runs
    ]
    created = services.run_create_batch(items=items, created_by=_by(request))
    # One read of every run's lease, as POST /runs reads its run's (run_out reads it from the run's cache).
    selectors.leases_cache([run for run, _ in created])
    items = [run_out(run, booked_owner=run.booked_owner if made else None) for run, made in created]
    # Rendered as GET /runs/{id} renders its run (_rendered): ninja's validation of the 100 answers against BatchOut
    # was 12 % of a batch's CPU (tests/api/test_batch_render.py compares the bytes).
    return _rendered(request, {"items": items}, status=201)


@router.get(
    "/runs",
    auth=viewer,
    tags=["runs"],
    response={200: RunListOut, **READ},
    summary="Runs, newest first, with a cursor for the next page",
    description="Also `attr.NAME=VALUE` (any number of them, AND-ed): runs whose attribute NAME has this value (its "
    "text: a string as it is, a number or boolean as JSON writes it).",
)
def run_list(
    request,
    status: RunStatusName | None = Query(None),
    workflow: str | None = Query(None, pattern=r"^[a-z0-9_-]{1,64}$"),
    parent: UUID | None = Query(None, description="only the children of this run"),
    stuck: bool = Query(False, description="true: only queued or running runs that no live lease holds"),
    limit: int = Query(50, ge=1, le=selectors.MAX_PAGE),
    cursor: str | None = Query(None, max_length=500),
    input: str | None = Query(None, description='a JSON object: runs whose input contains it ({"customer": "acme"})'),
    created_after: str | None = Query(None, description="ISO 8601 date-time: created at or after it (no zone: UTC)"),
    created_before: str | None = Query(None, description="ISO 8601 date-time: created before it (no zone: UTC)"),
    error_code: str | None = Query(None, description="runs whose error's code is this (error.code)"),
    q: str | None = Query(
        None,
        max_length=500,
        description="search: a run id (or its start), a step's key, an Idempotency-Key, or an attribute's value",
    ),
):
    found = search.search_filters(
        input=input, created_after=created_after, created_before=created_before, error_code=error_code
    )
    # attr.NAME=VALUE (any number, AND-ed): names no schema can list, read from the query itself.
    wanted = attributes.filters_of(request.GET.items())
    runs, next_cursor = selectors.run_list(
        status=status,
        workflow=workflow,
        parent=parent,
        stuck=stuck,
        limit=limit,
        cursor=cursor,
        q=q.strip() or None if q else None,
        attributes=wanted or None,
        user_id=request.auth.pk,
        **found,
    )
    # Rendered as GET /runs/{id} renders its run: run_summary makes exactly RunSummaryOut's fields and types
    # (tests/api/test_list_render.py compares the bytes), and validating 50 of them was a fifth of a page's time.
    return _rendered(request, {"items": [run_summary(run) for run in runs], "next_cursor": next_cursor}, status=200)


def _run_read(request):
    """GET /runs/{id}'s run, read in one statement with the token (tokens.auth.TokenAuthWith): its read and
    parameters; None for an id that is no run id (ninja answers 422 once the token is checked)."""
    return selectors.run_with_lease_read(run_id=request.resolver_match.kwargs.get("id"))


# One statement for the token and the run instead of two: each statement is also a few turns given up at the GIL
# among pal.web's threads, and the busiest read of the API went a quarter faster (docs/PERFORMANCE-code.md).
viewer_with_run = TokenAuthWith(role="viewer", read_of=_run_read)
_UNREAD = object()


@router.get(
    "/runs/{id}",
    auth=viewer_with_run,
    tags=["runs"],
    response={200: RunOut, **READ},
    summary="One run, with its lease and, while it has not ended, why it is not moving",
)
def run_detail(request, id: UUID):
    # Answered as ninja answers a RunOut (pal.api's renderer, JSON) without validating run_out's dict against RunOut
    # again: run_out makes exactly its fields and types (tests/api/test_read_path.py compares the bytes), and the
    # validation was about 4 % of uvicorn's samples for this call.
    # The run was read with the token (viewer_with_run), unless its id was not one to read (then read here).
    found = request.__dict__.get("auth_read", _UNREAD)
    run = selectors.run_with_lease(run_id=id) if found is _UNREAD else selectors.run_found(found, run_id=id)
    return _rendered(request, run_out(run), status=200)


@router.get(
    "/runs/{id}/events",
    auth=viewer,
    tags=["journal"],
    response={200: EventPageOut, **READ},
    summary="The run's journal, in seq order",
)
def run_events(request, id: UUID, after_seq: int = Query(0, ge=0), limit: int = Query(100, ge=1, le=1000)):
    services.run_get(run_id=id)
    items = events_for_run(run_id=id, after_seq=after_seq, limit=limit)
    return {"items": items, "next_after_seq": items[-1].seq if items else after_seq}


STREAM_DOC = {
    "description": (
        "Server-sent events: `id:` the seq, `event:` the kind, `data:` the event as JSON (as in /events). "
        "Replays the events after `Last-Event-ID` (or `after_seq`), then follows live; sends a `: keep-alive` "
        "comment when idle; closes after the run's final event (run_succeeded, run_failed, run_cancelled)."
    ),
    "responses": {
        "200": {"description": "the event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    },
}


@router.get(
    "/runs/{id}/events/stream",
    auth=viewer_async,
    tags=["journal"],
    response=READ,
    summary="Follow the run's journal live (server-sent events)",
    openapi_extra=STREAM_DOC,
)
async def run_events_stream(
    request,
    id: UUID,
    after_seq: int = Query(0, ge=0),
    last_event_id: str | None = Header(None, alias="Last-Event-ID", description="the last seq received"),
):
    start = after_seq
    if last_event_id is not None and last_event_id.strip():
        if not last_event_id.strip().isdigit():
            raise services.ServiceError(
                "Last-Event-ID must be a seq (a whole number)", code="invalid_last_event_id", status=422
            )
        start = int(last_event_id.strip())
    await in_db_thread(services.run_get, run_id=id)
    response = StreamingHttpResponse(sse_events(run_id=id, after_seq=start), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


@router.post(
    "/runs/{id}/events",
    auth=operator,
    tags=["journal"],
    response={201: EventOut, **WRITE},
    summary="Append a custom event (any kind but the engine's reserved ones)",
)
def run_event_post(request, id: UUID, event: EventIn):
    seq = services.run_event_append(
        run_id=id, kind=event.kind, step_id=event.step_id, payload=event.payload, by=_by(request)
    )
    return Status(201, event_get(run_id=id, seq=seq))


@router.get(
    "/runs/{a}/compare/{b}",
    auth=viewer,
    tags=["runs"],
    response={200: CompareOut, **READ},
    summary="Two runs step by step: each step's status, output (and where the outputs differ), duration, tokens "
    "and cost; totals of each",
)
def run_compare(request, a: UUID, b: UUID):
    return compare.run_compare(a=a, b=b)


@router.get(
    "/runs/{id}/waterfall",
    auth=viewer,
    tags=["runs"],
    response={200: WaterfallOut, **READ},
    summary="One bar per step attempt, from the journal; cached bars are steps a re-drive reused",
)
def run_waterfall(request, id: UUID):
    run = services.run_get(run_id=id)
    return {"run": compare.run_brief(run), "bars": selectors.run_waterfall(run)}


@router.get(
    "/runs/{id}/steps/{step_id}",
    auth=viewer,
    tags=["runs"],
    response={200: StepDetailOut, **READ},
    summary="One step (or one item, read[3]): every attempt with its input, output, error, timing, tokens, cost, "
    "key, side effects and child run",
)
def run_step(request, id: UUID, step_id: str):
    return step_detail(run=services.run_get(run_id=id), step_id=step_id)


@router.get(
    "/runs/{id}/receipt",
    auth=viewer,
    tags=["runs"],
    response={200: ReceiptOut, **READ},
    summary="The run's receipt: every step attempt with keys, tokens, cost and side effects; child runs "
    "nested; signed (Ed25519) when a key is configured",
)
def run_receipt(request, id: UUID):
    # Sent as built, not through the schema: what was signed is exactly what goes out (the schema documents it).
    receipt = receipts.run_receipt(run_id=id)
    return HttpResponse(utf8_safe_json(json.dumps(receipt, ensure_ascii=False)), content_type="application/json")


@router.get(
    "/runs/{id}/redrive/preview",
    auth=viewer,
    tags=["actions"],
    response={200: RedrivePreviewOut, **READ},
    summary="What a re-drive would reuse, run again and claim again",
)
def run_redrive_preview(request, id: UUID):
    return selectors.redrive_preview(services.run_get(run_id=id))


@router.post(
    "/runs/{id}/redrive",
    auth=operator,
    tags=["actions"],
    response={202: RunOut, **WRITE},
    summary="Re-drive a run (409 while a live lease holds it, unless force; 409 once it has ended)",
)
def run_redrive(request, id: UUID, body: RedriveIn):
    run = services.run_redrive(run_id=id, by=_by(request), reason=body.reason, force=body.force)
    return Status(202, run_out(run))


@router.post(
    "/runs/{id}/budget",
    auth=operator,
    tags=["actions"],
    response={200: RunOut, **WRITE},
    summary="Raise a run's budget caps (a run waiting on its budget goes on when the new caps allow)",
)
def run_budget(request, id: UUID, body: BudgetIn):
    run = services.run_budget_raise(
        run_id=id, by=_by(request), reason=body.reason, max_cost_usd=body.max_cost_usd, max_tokens=body.max_tokens
    )
    return Status(200, run_out(run))


@router.post(
    "/runs/{id}/cancel",
    auth=operator,
    tags=["actions"],
    response={202: RunOut, **WRITE},
    summary="Cancel a run (409 once it has ended)",
)
def run_cancel(request, id: UUID, body: ReasonIn):
    run = services.run_cancel(run_id=id, by=_by(request), reason=body.reason)
    return Status(202, run_out(run))


@router.post(
    "/runs/{id}/retry",
    auth=operator,
    tags=["actions"],
    response={202: RunOut, **WRITE},
    summary="A failed run goes on from its failed step with attempt + 1 (409 unless it failed)",
)
def run_retry(request, id: UUID, body: ReasonIn):
    run = services.run_retry(run_id=id, by=_by(request), reason=body.reason)
    return Status(202, run_out(run))


@router.post(
    "/runs/{id}/approvals/{step_id}",
    auth=operator,
    tags=["actions"],
    response={200: RunOut, **WRITE},
    summary="Decide an open approval (403 when assigned to others, 409 when the run does not wait on it)",
)
def run_approval(request, id: UUID, step_id: str, body: ApprovalIn):
    run = services.approval_decide(
        run_id=id,
        step_id=step_id,
        approved=body.decision(),
        comment=body.comment,
        attempt=body.attempt,
        arguments=body.arguments,
        answer=body.answer,
        choice=body.choice,
        by=_by(request),
        user=request.auth,
    )
    return run_out(run)


@router.post(
    "/runs/{id}/signals/{name}",
    auth=operator,
    tags=["actions"],
    response={202: SignalOut, **WRITE},
    summary="Send a signal; it is kept until the run waits on it",
)
def run_signal(request, id: UUID, name: str, body: SignalIn):
    signal = services.signal_send(run_id=id, name=name, payload=body.payload, by=_by(request))
    return Status(
        202,
        {
            "id": signal.id,
            "run_id": signal.run_id,
            "name": signal.name,
            "payload": signal.payload,
            "created_at": signal.created_at,
            "consumed_at": signal.consumed_at,
        },
    )


@router.post(
    "/runs/{id}/fork/preview",
    auth=operator,
    tags=["actions"],
    response={200: ForkPreviewOut, **errors(400, 401, 403, 404, 413, 422)},  # a read that takes a body
    summary="What a fork from a step would reuse (and from which row) and what it would run anew",
)
def run_fork_preview(request, id: UUID, body: ForkPreviewIn):
    return services.run_fork_preview(run_id=id, from_step=body.from_step, input=body.input)


@router.post(
    "/runs/{id}/fork",
    auth=operator,
    tags=["actions"],
    response={201: RunOut, **WRITE},
    summary="A new run of the same workflow version from a step on: the steps before it reuse the original's "
    "outputs (no call, nothing sent)",
)
def run_fork(request, id: UUID, body: ForkIn):
    run = services.run_fork(run_id=id, from_step=body.from_step, input=body.input, reason=body.reason, by=_by(request))
    return Status(201, run_out(run))


# --- system (no token) ----------------------------------------------------------------------------

PEM_DOC = {
    "responses": {
        "200": {
            "description": "PEM (SubjectPublicKeyInfo) of the Ed25519 key that signs receipts",
            "content": {"application/x-pem-file": {"schema": {"type": "string"}}},
        }
    }
}


@router.get(
    "/receipts/public-key",
    auth=None,
    tags=["system"],
    response=errors(404),
    openapi_extra=PEM_DOC,
    summary="The public key that signs receipts (404 not_configured while there is none)",
)
def receipt_public_key(request):
    try:
        pem = receipt_public_key_pem()
    except KeyNotConfigured as exc:
        raise services.NotFound(str(exc), code="not_configured") from None
    response = HttpResponse(pem, content_type="application/x-pem-file")
    response["X-PAL-Key-Id"] = key_id(settings.PAL_RECEIPT_PRIVATE_KEY.public_key())  # the receipts' signed.key_id
    return response


@router.get(
    "/health",
    auth=None,
    tags=["system"],
    response={200: HealthOut, 503: UnhealthyOut},
    summary="Database, broker and the last recovery sweep (503 naming what fails: the database, the broker, "
    "or a stale sweep)",
)
def health(request):
    report = selectors.health()
    problems = report.pop("problems")
    if problems:
        return Status(503, {**report, "problems": problems, "detail": "; ".join(problems), "code": "unhealthy"})
    return report

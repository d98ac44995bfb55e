"""The run page (/runs/<id>/): header, waterfall, journal, receipt and the live event stream, and the actions an
operator takes on it (cancel, retry, re-drive, approvals, signals)."""

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ValidationError
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET
from django_htmx.http import HTMX_STOP_POLLING

from journal.models import JournalEvent
from journal.selectors import events_window, waterfall_markers
from pal.clock import db_now
from pal.db_threads import in_db_thread

from .. import attributes, explain, receipts, selectors, services
from ..answers import AnswerInvalid, answer_from_form
from ..code import is_code, steps_of
from ..models import FINAL_STATUSES, RunStatus
from ..streams import sse_events
from ..waiting import approval_row, waits_of
from . import waterfall
from .access import can_operate, operator, reader, stream_access
from .decision_rows import decision_row
from .formatting import clock, compact_json, lease_text, pretty_json, run_took
from .forms import json_from_text
from .request import _back, _by, _reason, _run_or_404, _target

JOURNAL_WINDOW = 500
RECEIPT_ROWS = 300  # step attempts shown in the receipt's table; the JSON has them all
RECEIPT_INLINE_JSON = 200_000  # characters of receipt JSON shown inline; a larger one only through its link

# --- the run page ---------------------------------------------------------------------------------


def _header_context(run, *, now=None) -> dict:
    now = now or db_now()  # the lease's expiry is by the database's clock (pal.clock)
    lease = selectors.lease_of(run)
    tree_ids = selectors.run_tree_ids(run)
    return {
        "run": run,
        "now": now,
        "final": run.status in FINAL_STATUSES,
        "lease": lease,
        "lease_live": lease is not None and lease["expires_at"] >= now,
        "lease_text": lease_text(lease, now),
        "why": explain.run_why(run, lease=lease, now=now),
        "usage": selectors.run_usage_rollup(run, tree_ids=tree_ids),
        "children": len(tree_ids) - 1,
        "duration": run_took(run, now=now),
        "attributes": attributes.attributes_of([run.id]).get(run.id, {}),  # set as steps end: the poll shows them
        "input_json": pretty_json(run.input),
        "output_json": pretty_json(run.output) if run.output is not None else "",
        "error_json": pretty_json(run.error) if run.error is not None else "",
    }


def _actions_context(request, run, **extra) -> dict:
    tree_ids = selectors.run_tree_ids(run)
    return {
        "run": run,
        "final": run.status in FINAL_STATUSES,
        "can_operate": can_operate(request.user),
        "approvals": selectors.approvals_pending(run_ids=tree_ids),
        "waiting_signal": (run.waiting_on or {}).get("name") if (run.waiting_on or {}).get("kind") == "signal" else "",
        # A run that has not ended, or failed, of a JSON workflow may move to another version (runs.services.move).
        "movable": run.status not in (RunStatus.SUCCEEDED, RunStatus.CANCELLED)
        and not is_code(run.workflow.definition),
        **extra,
    }


def _waterfall_context(run, *, axis=None, nested=False) -> dict:
    bars = selectors.run_waterfall(run)
    markers = waterfall_markers(run_id=run.id)
    return {
        "run": run,
        "nested": nested,
        "final": run.status in FINAL_STATUSES,
        "waterfall": waterfall.waterfall_layout(run, bars, markers, now=timezone.now(), axis=axis, steps=steps_of(run)),
    }


def _journal_rows(events) -> list[dict]:
    return [
        {
            "seq": e.seq,
            "kind": e.kind,
            "step_id": e.step_id or "",
            "attempt": e.attempt or "",
            "at": clock(e.created_at),
            "iso": e.created_at.isoformat(),
            "writer": e.writer,
            "epoch": e.epoch,
            "summary": compact_json(e.payload),
            "payload": pretty_json(e.payload),
        }
        for e in events
    ]


def _journal_context(run, *, before_seq=None) -> dict:
    events, more = events_window(run_id=run.id, before_seq=before_seq, limit=JOURNAL_WINDOW)
    return {
        "run": run,
        "events": _journal_rows(events),
        "more": more,
        "first_seq": events[0].seq if events else 0,
        "last_seq": events[-1].seq if events else 0,
        "latest": before_seq is None,
        "window": JOURNAL_WINDOW,
    }


def _receipt_context(run) -> dict:
    """The receipt the API answers (runs.receipts: the run's tree, signed when a key is configured)."""
    receipt = receipts.run_receipt(run_id=run.id)
    steps = receipt.get("steps") or []
    text = pretty_json(receipt)
    # A receipt of thousands of steps is read as JSON (the link); the page shows its first rows and totals.
    return {
        "run": run,
        "receipt": receipt,
        # A fan-out's item attempts counted here: in a template, `s.items` of a step without that key would be
        # the dict's items() method (Django's lookup falls back to attributes), so every step had "items".
        "steps": [{**s, "item_attempts": len(s.get("items") or ())} for s in steps[:RECEIPT_ROWS]],
        "steps_hidden": max(len(steps) - RECEIPT_ROWS, 0),
        "receipt_json": text if len(text) <= RECEIPT_INLINE_JSON else "",
    }


def _int_param(params, name):
    raw = params.get(name)
    return int(raw) if raw and raw.isdigit() else None


@require_GET
@reader
def run_detail(request, run_id):
    run = _run_or_404(run_id)
    target = _target(request)
    if target == "run-header":
        response = render(request, "runs/detail.html#header", _header_context(run))
        if run.status in FINAL_STATUSES:
            response.status_code = HTMX_STOP_POLLING  # the run has ended: the header stops polling
        return response
    if target == "run-actions":
        return render(request, "runs/detail.html#actions", _actions_context(request, run))
    if target == "waterfall":
        return render(request, "runs/detail.html#waterfall", _waterfall_context(run))
    if target == "journal-earlier":
        return render(
            request,
            "runs/detail.html#journal_rows",
            _journal_context(run, before_seq=_int_param(request.GET, "before_seq")),
        )
    if target == "receipt":
        return render(request, "runs/detail.html#receipt", _receipt_context(run))
    before_seq = _int_param(request.GET, "before_seq")
    context = {
        **_header_context(run),
        **_waterfall_context(run),
        **_journal_context(run, before_seq=before_seq),
        **_actions_context(request, run),
        "admin_url": reverse("admin:runs_run_change", args=[run.id]),
    }
    return render(request, "runs/detail.html", context)


@require_GET
@reader
def run_waterfall(request, run_id):
    """A run's waterfall alone: nested under its parent's row (htmx, on the parent's time axis) or a page."""
    run = _run_or_404(run_id)
    context = _waterfall_context(run, axis=waterfall.parse_axis(request.GET.get("axis")), nested=bool(request.htmx))
    return render(request, "runs/detail.html#waterfall" if request.htmx else "runs/waterfall.html", context)


@require_GET
@reader
def run_receipt(request, run_id):
    """The receipt: a page (or the fragment), or its JSON with ?format=json (what GET /api/v1/runs/{id}/receipt
    answers, for a logged-in operator without a token)."""
    run = _run_or_404(run_id)
    context = _receipt_context(run)
    if request.GET.get("format") == "json":
        response = HttpResponse(context["receipt_json"], content_type="application/json")
        response["Content-Disposition"] = f'inline; filename="receipt-{run.id}.json"'
        return response
    return render(request, "runs/detail.html#receipt" if request.htmx else "runs/receipt.html", context)


# --- the live journal: server-sent events on the session ------------------------------------------


def _nothing_more(*, run_id, after_seq: int) -> bool:
    """True when the run has ended and has no event after after_seq. Raises NotFound for an unknown run."""
    run = services.run_get(run_id=run_id)
    return run.is_final and not JournalEvent.objects.filter(run_id=run_id, seq__gt=after_seq).exists()


async def run_events_stream(request, run_id):
    """The run's journal as server-sent events for the page (session login): the same generator as
    GET /api/v1/runs/{id}/events/stream, unnamed events so one EventSource listener gets every kind.
    Replays after Last-Event-ID (a reconnect) or after_seq, follows live, closes after the run ends; 204 when the
    run is over and nothing is left to send."""
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET"})
    access = await in_db_thread(stream_access, request.user)  # the session is read on that thread
    if access == "login":
        return redirect_to_login(request.get_full_path())
    if access == "forbidden":
        return HttpResponse("reading runs needs the permission runs.view_run", status=403, content_type="text/plain")
    raw = (request.headers.get("Last-Event-ID") or request.GET.get("after_seq") or "0").strip()
    if not raw.isdigit():
        return HttpResponse(
            "Last-Event-ID and after_seq are a seq (a whole number)", status=400, content_type="text/plain"
        )
    try:
        if await in_db_thread(_nothing_more, run_id=run_id, after_seq=int(raw)):
            # 204 tells an EventSource to stop reconnecting: the run is over and it has every event.
            return HttpResponse(status=204)
    except services.NotFound as exc:
        return HttpResponse(exc.detail, status=404, content_type="text/plain")
    response = StreamingHttpResponse(
        sse_events(run_id=run_id, after_seq=int(raw), named=False), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# --- run actions ----------------------------------------------------------------------------------


def _acted(request, run, *, ok: str = "", error: services.ServiceError | None = None, **extra):
    """The answer to an action on the run page: for htmx, the actions panel with the result and the header
    (out of band); without JavaScript, back to the run page with a message."""
    page_run = run
    page_id = request.POST.get("page")
    if page_id and page_id != str(run.id):
        try:
            page_run = services.run_get(run_id=page_id)
        except services.ServiceError:
            page_run = run
    if not request.htmx:
        if error is not None:
            messages.error(request, error.detail)
        else:
            messages.success(request, ok)
        return HttpResponseRedirect(_back(request, reverse("runs:detail", args=[page_run.id]) + "#actions"))
    if error is not None and error.status == 403:
        # htmx swaps no 403 (base.html): pal.js shows a plain-text answer in the flash bar.
        return HttpResponse(error.detail, status=403, content_type="text/plain")
    notice = {"level": "error", "text": error.detail} if error is not None else {"level": "ok", "text": ok}
    if (_target(request) or "").startswith("inbox-"):  # a row of the inbox
        answer = decision_row(
            request,
            run,
            step_id=extra.get("approval", ""),
            target=_target(request) or "",
            notice=notice,
            decided=error is None,
        )
        answer.status_code = error.status if error else 200
        return answer
    if (_target(request) or "").startswith("approval-"):  # a row of the ops dashboard
        run.refresh_from_db()
        item = approval_row(run, step_id=extra.get("approval", ""), target=_target(request) or "")
        body = render_to_string(
            "runs/ops.html#approval_row",
            {"item": item, "notice": notice, "decided": error is None, "can_operate": True},
            request=request,
        )
        return HttpResponse(body, status=error.status if error else 200)
    page_run.refresh_from_db()
    body = render_to_string("runs/detail.html#actions", _actions_context(request, page_run, **extra), request=request)
    # A refused re-drive shows its refusal inside the re-drive panel, which stays open: not twice.
    body += render_to_string(
        "runs/detail.html#notice", {"notice": None if "redrive" in extra else notice}, request=request
    )
    body += render_to_string("runs/detail.html#header", {**_header_context(page_run), "oob": True}, request=request)
    return HttpResponse(body, status=error.status if error else 200)


@operator
def run_cancel(request, run_id):
    run = _run_or_404(run_id)
    try:
        services.run_cancel(run_id=run.id, by=_by(request), reason=_reason(request))
    except services.ServiceError as exc:
        return _acted(request, run, error=exc)
    return _acted(request, run, ok=f"Cancelled by {_by(request)}: {_reason(request)}")


@operator
def run_retry(request, run_id):
    run = _run_or_404(run_id)
    try:
        services.run_retry(run_id=run.id, by=_by(request), reason=_reason(request))
    except services.ServiceError as exc:
        return _acted(request, run, error=exc)
    return _acted(request, run, ok=f"Retried by {_by(request)}: it goes on from its failed step with a new attempt.")


def _redrive_context(run, **extra) -> dict:
    return {"run": run, "preview": selectors.redrive_preview(run), **extra}


@reader
def run_redrive(request, run_id):
    """GET: what a re-drive would do (the preview) and its form. POST (operators): re-drive, with a reason."""
    run = _run_or_404(run_id)
    if request.method == "GET":
        context = _redrive_context(run, can_operate=can_operate(request.user), embedded=bool(request.htmx))
        return render(request, "runs/detail.html#redrive" if request.htmx else "runs/redrive.html", context)
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    return _redrive_post(request, run_id=run.id)


@operator
def _redrive_post(request, run_id):
    run = _run_or_404(run_id)
    force = request.POST.get("force") in ("1", "on")
    try:
        redriven = services.run_redrive(run_id=run.id, by=_by(request), reason=_reason(request), force=force)
    except services.ServiceError as exc:
        # Keep the re-drive panel open with the preview, the reason typed and the refusal beside it.
        return _acted(
            request,
            run,
            error=exc,
            redrive=_redrive_context(run, reason=_reason(request), force=force, can_operate=True, error=exc.detail),
        )
    # Queued with no task: its concurrency group was full (runs.services.run_redrive). The message says so.
    held = redriven.status == RunStatus.QUEUED and selectors.lease_of(redriven) is None
    waits = f". Its group is full, so it waits: {explain.run_why(redriven)}" if held else ""
    done = f"Re-driven{' (forced)' if force else ''} by {_by(request)}: {_reason(request)}{waits}"
    return _acted(request, run, ok=done)


def _attempt(request) -> int | None:
    raw = request.POST.get("attempt", "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise services.ServiceError(f"attempt must be a whole number from 1, got {raw!r}", code="invalid_attempt")
    return int(raw)


def _arguments(request, run, step_id: str) -> dict | None:
    """A tool call's arguments as the operator left them in the form: None when unchanged (or no tool call's)."""
    raw = request.POST.get("arguments")
    if raw is None:
        return None
    try:
        edited = json_from_text(raw)
    except ValidationError as exc:
        raise services.ServiceError(f"arguments: {exc.messages[0]}", code="invalid_arguments", status=422) from None
    if not isinstance(edited, dict):
        raise services.ServiceError("arguments: must be a JSON object", code="invalid_arguments", status=422)
    asked = next((w.get("arguments") for w in waits_of(run.waiting_on) if w.get("step_id") == step_id), None)
    return None if edited == asked else edited


def _typed(request, run, step_id: str, approved: bool) -> tuple[dict | None, str | None]:
    """A typed decision's answer (its form's fields, `answer.NAME`, read by their types) and choice, as posted."""
    choice = request.POST.get("choice") or None
    if not approved:
        return None, None
    form = (selectors.approval_open(run, step_id) or {}).get("form")
    if not form:
        return None, choice
    try:
        return answer_from_form(form, request.POST), choice
    except AnswerInvalid as exc:
        raise services.ServiceError(f"{exc.field}: {exc.message}", code="invalid_answer", status=422) from None


@operator
def run_approval(request, run_id, step_id):
    run = _run_or_404(run_id)
    # A choice's button decides with that choice; the reject button says approved=0.
    approved = request.POST.get("approved") == "1" or (
        bool(request.POST.get("choice")) and request.POST.get("approved") != "0"
    )
    try:
        answer, choice = _typed(request, run, step_id, approved)
        # The form carries the attempt it showed, so a decision made on a stale page (or sent twice) cannot
        # decide a later attempt of the step.
        services.approval_decide(
            run_id=run.id,
            step_id=step_id,
            approved=approved,
            by=_by(request),
            user=request.user,
            comment=request.POST.get("comment", "").strip(),
            attempt=_attempt(request),
            arguments=_arguments(request, run, step_id) if approved else None,
            answer=answer,
            choice=choice,
        )
    except services.ServiceError as exc:
        return _acted(request, run, error=exc, approval=step_id)
    verb = f"Chose {choice!r} for" if choice else ("Approved" if approved else "Rejected")
    return _acted(
        request, run, ok=f"{verb} step {step_id} of run {str(run.id)[:8]} as {_by(request)}.", approval=step_id
    )


@operator
def run_signal(request, run_id):
    run = _run_or_404(run_id)
    name = request.POST.get("name", "").strip()
    raw = request.POST.get("payload", "").strip() or "{}"
    try:
        try:
            payload = json_from_text(raw)
        except ValidationError as exc:
            raise services.ServiceError(
                f"the payload is not JSON a run can keep: {exc.messages[0]}", code="invalid_payload", status=422
            ) from None
        services.signal_send(run_id=run.id, name=name, payload=payload, by=_by(request))
    except services.ServiceError as exc:
        return _acted(request, run, error=exc, signal={"name": name, "payload": raw})
    return _acted(request, run, ok=f"Signal {name!r} sent; the run takes it when it waits on that name.")

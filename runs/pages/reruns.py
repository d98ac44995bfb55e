"""The reruns page (/reruns/): select runs by the filter fields, preview what each would reuse and run again, name
the incident and start; /reruns/<id>/ watches its progress live and aborts it. The same services as POST /reruns."""

# The preview is a GET of /reruns/ with the filter in the query (a reader may look; htmx swaps only #rerun-preview),
# so it can be bookmarked and shared during an incident. Starting posts the previewed filter again: the service reads
# it once more and fixes the set at that moment. A refusal (a bad field, a blank reason) is the service's own words.

from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django_htmx.http import HTMX_STOP_POLLING

from .. import selectors, services
from ..models import FINAL_STATUSES, RerunItemStatus, RerunStatus
from .access import can_operate, operator, reader
from .request import _by, _reason, _target

FILTERS = ("workflow", "status", "step_id", "error_code", "created_after", "created_before", "view")
ITEMS_SHOWN = 200


def _asked(params) -> dict:
    """The filter fields, from_step, per_second and name as typed (the form shows them again)."""
    asked = {name: (params.get(name) or "").strip() for name in (*FILTERS, "from_step", "per_second", "name")}
    asked["from_step"] = asked["from_step"] or "failed"
    return asked


def _per_second(text: str) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise services.ServiceError(
            f"per_second: a number of runs a second, not {text!r}", code="invalid_per_second", status=422
        ) from None


def _filter_of(asked: dict) -> dict:
    return {name: asked[name] for name in FILTERS if asked[name]}


@require_GET
@reader
def rerun_list(request):
    """The reruns, the selection form and, once asked (preview=1), the preview of what it would rerun."""
    asked = _asked(request.GET)
    context = {
        "asked": asked,
        "query": urlencode({k: v for k, v in asked.items() if v}),
        "can_operate": can_operate(request.user),
        "problems": [],
        "preview": None,
    }
    status = 200
    if request.GET.get("preview"):
        try:
            context["preview"] = services.rerun_preview(
                filter=_filter_of(asked),
                from_step=asked["from_step"],
                per_second=_per_second(asked["per_second"]),
                user=request.user,
            )
        except services.ServiceError as exc:
            context["problems"] = [exc.detail]
            status = exc.status
    if _target(request) == "rerun-preview":
        return render(request, "runs/reruns.html#preview", context, status=status)
    reruns = selectors.rerun_list(limit=50)
    context.update(
        reruns=reruns,
        actions=selectors.rerun_actions(rerun_ids=[r.id for r in reruns]),
        workflows=[w.name for w in selectors.workflow_list_latest()],
        views=list(selectors.views_visible(user=request.user).order_by("name")[:200]),
        statuses=("failed", "succeeded", "cancelled"),
    )
    return render(request, "runs/reruns.html", context, status=status)


@operator
def rerun_new(request):
    """Start the rerun of the previewed filter (name, reason, per_second): to its page, or back with the refusal."""
    asked = _asked(request.POST)
    try:
        rerun = services.rerun_start(
            filter=_filter_of(asked),
            from_step=asked["from_step"],
            reason=_reason(request),
            by=_by(request),
            name=asked["name"],
            per_second=_per_second(asked["per_second"]),
            user=request.user,
        )
    except services.ServiceError as exc:
        messages.error(request, f"Not started: {exc.detail}")
        query = urlencode({**{k: v for k, v in asked.items() if v}, "preview": "1"})
        return HttpResponseRedirect(f"{reverse('runs:reruns')}?{query}")
    messages.success(request, f"Rerun “{rerun.name}” started: {rerun.count} run(s)")
    return HttpResponseRedirect(reverse("runs:rerun", args=[rerun.id]))


@require_GET
@reader
def rerun_detail(request, rerun_id):
    """One rerun: its progress and its runs, refreshed every second while it runs."""
    try:
        rerun = selectors.rerun_get(rerun_id=rerun_id)
    except services.NotFound as exc:
        raise Http404(exc.detail) from None
    items = selectors.rerun_items(rerun_id=rerun.id, limit=ITEMS_SHOWN)
    context = {
        "rerun": rerun,
        "actions": selectors.rerun_actions(rerun_ids=[rerun.id]).get(rerun.id, {}),
        "items": items,
        "items_shown": ITEMS_SHOWN,
        "watching": rerun.status == RerunStatus.RUNNING or any(_going(item) for item in items),
        "can_operate": can_operate(request.user),
    }
    if _target(request) == "rerun-progress":
        response = render(request, "runs/rerun.html#progress", context)
        if not context["watching"]:
            response.status_code = HTMX_STOP_POLLING  # it is over, and so are the runs it reran: stop polling
        return response
    return render(request, "runs/rerun.html", context)


def _going(item) -> bool:
    """A run this rerun reran (or its fork) that has not ended yet: the page keeps watching it."""
    run = item.fork_run if item.fork_run_id else item.run
    return item.status == RerunItemStatus.RERUN and run is not None and run.status not in FINAL_STATUSES


@operator
def rerun_abort(request, rerun_id):
    try:
        rerun = services.rerun_abort(rerun_id=rerun_id, by=_by(request), reason=_reason(request))
    except services.NotFound as exc:
        raise Http404(exc.detail) from None
    except services.ServiceError as exc:
        messages.error(request, f"Not aborted: {exc.detail}")
    else:
        messages.success(request, f"Rerun “{rerun.name}” aborted after {rerun.done} of {rerun.count} run(s)")
    return HttpResponseRedirect(reverse("runs:rerun", args=[rerun_id]))

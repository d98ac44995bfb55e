"""The inbox (/inbox/): every open decision of every run, filtered and ordered, each decided from its row (an approval's
form, a budget's raise) or opened on its run; and the page a notification's signed link opens (/decisions/<token>/)."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from .. import attributes, search, selectors, services
from ..answers import AnswerInvalid, answer_from_form
from ..models import Workflow
from .access import can_operate, reader
from .decision_rows import KIND_WORDS, decision_row_context

# The ages the filter offers (open longer than), as the query says them.
AGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "4h": timedelta(hours=4), "1d": timedelta(days=1)}
AGES["7d"] = timedelta(days=7)


def inbox_filters(params) -> dict:
    """The inbox's filters from its query: workflow, assignee ("me", a user or group name), kind, age, order. A value
    the page does not offer is dropped (the form shows what is applied)."""
    kind = params.get("kind", "")
    order = params.get("order", "oldest")
    age = params.get("age", "")
    return {
        "attr_name": params.get("attr_name", "").strip()[:40],
        "attr_value": params.get("attr_value", "").strip()[:200],
        "workflow": params.get("workflow", "").strip()[:64],
        "assignee": params.get("assignee", "").strip()[:150],
        "kind": kind if kind in selectors.DECISION_KINDS else "",
        "age": age if age in AGES else "",
        "order": order if order in selectors.DECISION_ORDERS else "oldest",
    }


def _attributes(filters: dict) -> dict[str, str] | None:
    """The attribute filter's {name: text}; 422 (InvalidFilter) naming it when the name cannot be one."""
    if not filters["attr_name"] or not filters["attr_value"]:
        return None
    return attributes.filters_of([(attributes.PREFIX + filters["attr_name"], filters["attr_value"])])


def _rows(request, filters: dict) -> list[dict]:
    decisions = selectors.decisions_open(
        attributes=_attributes(filters),
        workflow=filters["workflow"],
        assignee=filters["assignee"],
        user=request.user,
        kind=filters["kind"],
        older_than=AGES.get(filters["age"]),
        order=filters["order"],
    )
    return [decision_row_context(d) for d in decisions]


@require_GET
@reader
def inbox(request):
    """The open decisions. Its list refreshes itself (pal.js asks while nobody types in it); without JavaScript, the
    filter form and the reload."""
    filters = inbox_filters(request.GET)
    query = request.GET.urlencode()
    problems = []
    try:
        rows = _rows(request, filters)
    except search.InvalidFilter as exc:
        problems, rows = [exc.detail], []
    context = {
        "problems": problems,
        "rows": rows,
        "filters": filters,
        "query": query,
        "ages": list(AGES),
        "kinds": KIND_WORDS,
        "can_operate": can_operate(request.user),
        "next": request.get_full_path(),
    }
    if request.htmx and request.htmx.target == "inbox-list":
        return render(request, "runs/inbox.html#list", context)
    context["workflows"] = sorted(set(Workflow.objects.values_list("name", flat=True)))
    context["counts"] = selectors.decisions_count(user=request.user)
    return render(request, "runs/inbox.html", context)


# --- a notification's signed link -----------------------------------------------------------------


@login_not_required
@require_http_methods(["GET", "POST"])
def decision_link(request, token: str):
    """GET: the decision the link names (its prompt, its form), decidable here without a login when the approval
    allows it (link_decides); else a way to log in and decide. POST: decide once (410 after)."""
    try:
        link = services.approval_link_open(token=token)
    except services.ServiceError as exc:
        return render(request, "runs/decision_link.html", {"error": exc.detail}, status=exc.status)
    if request.method == "GET":
        return render(request, "runs/decision_link.html", _link_context(link))
    if not link["request"].get("link_decides"):
        return render(request, "runs/decision_link.html", _link_context(link), status=403)
    approved = request.POST.get("approved") == "1" or (
        bool(request.POST.get("choice")) and request.POST.get("approved") != "0"
    )
    form = link["request"].get("form")
    try:
        try:
            answer = answer_from_form(form, request.POST) if form and approved else None
        except AnswerInvalid as exc:
            raise services.ServiceError(f"{exc.field}: {exc.message}", code="invalid_answer", status=422) from None
        run = services.approval_decide_by_link(
            token=token,
            approved=approved,
            comment=request.POST.get("comment", "").strip(),
            answer=answer,
            choice=(request.POST.get("choice") or None) if approved else None,
        )
    except services.ServiceError as exc:
        if exc.status == 422:
            return render(request, "runs/decision_link.html", {**_link_context(link), "error": exc.detail}, status=422)
        return render(request, "runs/decision_link.html", {"error": exc.detail}, status=exc.status)
    verb = "approved" if approved else "rejected"
    messages.success(request, f"Step {link['step_id']} of run {str(run.id)[:8]} {verb}. Thank you.")
    return HttpResponseRedirect(reverse("runs:decision_done"))


def _link_context(link: dict) -> dict:
    item = selectors.Decision(kind="approval", run=link["run"], wait=link["request"], opened_at=link["run"].updated_at)
    return {"item": item, "request_": link["request"], "link_decides": bool(link["request"].get("link_decides"))}


@login_not_required
@require_GET
def decision_done(request):
    """Where a decision through a link lands: its message, and nothing to decide again."""
    return render(request, "runs/decision_link.html", {"done": True})

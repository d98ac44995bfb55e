"""The runs list (/runs/) with its filters, and bulk actions over the ticked or matching runs (/runs/bulk/)."""

import json
import uuid
from datetime import UTC
from typing import Any
from urllib.parse import urlencode

from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django_htmx.http import HTMX_STOP_POLLING

from pal.clock import db_now

from .. import attributes, explain, search, selectors, services
from ..models import FINAL_STATUSES, BulkAction, RunStatus
from . import saved_views
from .access import can_operate, operator, reader
from .request import _by, _target

PAGE_SIZE = 50

# --- run list -------------------------------------------------------------------------------------

LIST_FILTERS = ("status", "workflow", "parent", "stuck", "q", *search.SEARCH_FILTERS)


def _list_filters(params, *, user=None) -> tuple[dict, list[str]]:
    """The list's filters from the query string, checked; a bad one is dropped with a message. view=ID (a saved
    view the user sees) stands for its filter, which the form then shows; attr.NAME=VALUE are kept as they came."""
    problems: list[str] = []
    view = None
    if (params.get("view") or "").strip() and user is not None:
        try:
            view = selectors.view_get(view_id=params["view"].strip(), user=user)
        except services.NotFound as exc:
            problems.append(exc.detail)
        else:
            params = {**view.filter, "sort": params.get("sort") or ""}
    filters: dict[str, Any] = {
        "status": params.get("status") or "",
        "workflow": (params.get("workflow") or "").strip(),
        "parent": (params.get("parent") or "").strip(),
        "stuck": params.get("stuck") in ("1", "on", "true"),
        "q": (params.get("q") or "").strip()[: selectors.views.MAX_Q],
    }
    if filters["status"] and filters["status"] not in RunStatus.values:
        problems.append(f"unknown status {filters['status']!r}")
        filters["status"] = ""
    if filters["parent"]:
        try:
            filters["parent"] = str(uuid.UUID(filters["parent"]))
        except ValueError:
            problems.append(f"parent {filters['parent']!r} is not a run id")
            filters["parent"] = ""
    for name in search.SEARCH_FILTERS:  # kept as text (the form shows it, a bulk action stores it), read once here
        filters[name] = (params.get(name) or "").strip()
        try:
            found = search.search_filters(**{name: filters[name]})
        except search.InvalidFilter as exc:
            problems.append(exc.detail)
            filters[name] = ""
            continue
        if name == "input" and name in found:
            filters[name] = json.dumps(found[name], ensure_ascii=False, separators=(", ", ": "))
        elif name in found and name != "error_code":  # as <input type="datetime-local"> shows it, in UTC
            filters[name] = found[name].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    filters.update(_attribute_filters(params, problems))
    if view is not None:
        filters["view"] = str(view.id)
    return filters, problems


def _attribute_filters(params, problems: list[str]) -> dict[str, str]:
    """attr.NAME=VALUE pairs (the links' form), and the form's attr_name / attr_value pair, each checked."""
    pairs = [(key, params.get(key)) for key in params if key.startswith(attributes.PREFIX)]
    name = (params.get("attr_name") or "").strip()
    if name:
        pairs.append((attributes.PREFIX + name, (params.get("attr_value") or "").strip()))
    kept: dict[str, str] = {}
    for key, value in pairs:
        value = (value or "").strip()
        if not value:
            continue
        try:
            attributes.filters_of([(key, value)])
        except search.InvalidFilter as exc:
            problems.append(exc.detail)
            continue
        kept[key] = value
    return kept


def _search_args(filters: dict) -> dict:
    """The checked search and attribute filters' texts as runs_matching's arguments."""
    found: dict[str, Any] = search.search_filters(**{name: filters[name] for name in search.SEARCH_FILTERS})
    wanted = attributes.filters_of(filters.items())
    if wanted:
        found["attributes"] = wanted
    return found


def _query(filters: dict, **extra) -> str:
    pairs = {k: ("1" if v is True else v) for k, v in {**filters, **extra}.items() if v}
    return urlencode(pairs)


def _list_rows(runs, now) -> list[dict]:
    rows = []
    attributes_of = attributes.attributes_of(run.id for run in runs)  # one read for the page
    for run in runs:
        lease = selectors.lease_of(run)  # from select_related: no query
        rows.append(
            {
                "run": run,
                "lease": lease,
                "state": explain.run_state_line(run, lease=lease, now=now),
                "final": run.status in FINAL_STATUSES,
                "attributes": attributes_of.get(run.id, {}),
            }
        )
    return rows


def _sorted(rows: list[dict], sort: str) -> list[dict]:
    """This page's rows by an attribute (sort: NAME, or -NAME for the highest first): numbers by value, then
    texts; runs without it last. The pages themselves stay newest first."""
    name, descending = sort.lstrip("-"), sort.startswith("-")

    def key(row):
        value = row["attributes"].get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value, "")
        return (1, 0, value if isinstance(value, str) else json.dumps(value))

    present = [row for row in rows if name in row["attributes"]]
    return sorted(present, key=key, reverse=descending) + [row for row in rows if name not in row["attributes"]]


def _runs(filters: dict, *, cursor, user) -> tuple[list, str | None]:
    return selectors.run_list(
        status=filters["status"] or None,
        workflow=filters["workflow"] or None,
        parent=filters["parent"] or None,
        stuck=filters["stuck"],
        q=filters["q"] or None,
        user_id=user.pk,
        limit=PAGE_SIZE,
        cursor=cursor,
        **_search_args(filters),
    )


@require_GET
@reader
def run_list(request):
    filters, problems = _list_filters(request.GET, user=request.user)
    sort = (request.GET.get("sort") or "").strip()
    cursor = request.GET.get("cursor") or None
    try:
        runs, next_cursor = _runs(filters, cursor=cursor, user=request.user)
    except selectors.InvalidCursor as exc:
        problems.append(exc.detail)
        cursor = None
        runs, next_cursor = _runs(filters, cursor=None, user=request.user)
    rows = _list_rows(runs, db_now())  # leases are judged by the database's clock
    names = sorted({name for row in rows for name in row["attributes"]})
    if sort.lstrip("-") in names:
        rows = _sorted(rows, sort)
    else:
        sort = ""
    kept = {**filters, "sort": sort}
    checked = set(request.GET.getlist("ids"))  # the rows' poll sends the ticked boxes, so a refresh keeps them
    context = {
        "rows": rows,
        "checked": checked,
        "filters": filters,
        # (name, value, the query without it) of each attribute filter: the chips and their remove links.
        "attribute_filters": [
            (key[len(attributes.PREFIX) :], value, _query(_dropped(filters, key), sort=sort))
            for key, value in filters.items()
            if key.startswith(attributes.PREFIX) and value
        ],
        "attribute_names": names,
        "sort": sort,
        "problems": problems,
        "query": _query(filters),
        "page_query": _query(kept, cursor=cursor),
        "next_query": _query(kept, cursor=next_cursor) if next_cursor else "",
        "first_page": cursor is None,
        "statuses": RunStatus.values,
        "can_operate": can_operate(request.user),
        "bulk_actions": BulkAction.ACTIONS,
    }
    if _target(request) == "run-rows":
        return render(request, "runs/list.html#run_rows", context)
    if _target(request) == "saved-view-list":  # the views' live counts, asked for once the page has loaded
        context.update(saved_views.views_context(request, filters, counted=True))
        return render(request, "runs/list.html#saved_view_list", context)
    context.update(saved_views.views_context(request, filters))
    context["workflows"] = [w.name for w in selectors.workflow_list_latest()]
    return render(request, "runs/list.html", context)


def _dropped(filters: dict, key: str) -> dict:
    """The filters without this one (a chip's remove link); a view's filter changed is no longer the view."""
    return {k: v for k, v in filters.items() if k not in (key, "view")}


# --- bulk actions ---------------------------------------------------------------------------------


def _bulk_request(request) -> tuple[str, dict, list[str]]:
    """(action, filters, problems) of a bulk form: the ticked runs, or every run matching the list's filters."""
    action = request.POST.get("action", "")
    problems: list[str] = []
    if request.POST.get("previewed"):  # the confirmation: exactly the set that was previewed
        try:
            filters = json.loads(request.POST["previewed"])
            known = {"ids", "view", *LIST_FILTERS}
            if not isinstance(filters, dict) or any(
                key not in known and not key.startswith(attributes.PREFIX) for key in filters
            ):
                raise ValueError("unknown filters")
            filters["ids"] = [str(uuid.UUID(str(i))) for i in filters.get("ids") or []]
            filters = {k: v for k, v in filters.items() if v}
        except (ValueError, TypeError, AttributeError):
            return action, {}, ["the previewed set could not be read; preview again"]
        return action, filters, []
    if request.POST.get("scope") == "matching":
        filters, problems = _list_filters(request.POST, user=request.user)
        filters = {k: v for k, v in filters.items() if v}
    else:
        ids = []
        for raw in request.POST.getlist("ids"):
            try:
                ids.append(str(uuid.UUID(raw)))
            except ValueError:
                problems.append(f"{raw!r} is not a run id")
        if not ids:
            problems.append("tick at least one run, or choose every run matching the filters")
        filters = {"ids": ids}
    return action, filters, problems


@operator
def bulk(request):
    """Step 1 (step=preview): how many runs the action would apply to. Step 2 (step=start): start it in the
    background and show its progress."""
    action, filters, problems = _bulk_request(request)
    if filters.get("view") and not problems:  # a saved view as the target: one this user sees
        try:
            selectors.view_get(view_id=filters["view"], user=request.user)
        except services.NotFound as exc:
            problems.append(exc.detail)
    reason = request.POST.get("reason", "").strip()
    force = request.POST.get("force") in ("1", "on")
    version = _version(request.POST.get("version", ""), action=action, problems=problems)
    context = {
        "action": action,
        "filters": filters,
        "filters_json": json.dumps(filters),
        "reason": reason,
        "force": force,
        "version": version,
        "problems": problems,
    }
    status = 200
    if not problems:
        try:
            if request.POST.get("step") == "start":
                started = services.bulk_start(
                    action=action, filters=filters, reason=reason, by=_by(request), force=force, version=version
                )
                if not request.htmx:
                    return HttpResponseRedirect(reverse("runs:bulk_progress", args=[started.id]))
                return render(request, "runs/bulk_progress.html#progress", {"bulk": started})
            context["preview"] = services.bulk_preview(action=action, filters=filters, version=version)
        except services.ServiceError as exc:
            context["problems"] = [exc.detail]
            status = exc.status
    else:
        status = 400
    template = "runs/bulk.html#preview" if request.htmx else "runs/bulk.html"
    return render(request, template, context, status=status)


def _version(text: str, *, action: str, problems: list[str]) -> int | None:
    """A bulk move's version, typed in the form: a whole number of 1 or more (a problem named otherwise)."""
    if action != "move":
        return None
    try:
        version = int(text.strip())
    except ValueError:
        version = 0
    if version < 1:
        problems.append("a move needs the version to move the runs to (a whole number of 1 or more)")
        return None
    return version


@require_GET
@reader
def bulk_progress(request, bulk_id: int):
    try:
        bulk_action = selectors.bulk_get(bulk_id=bulk_id)
    except services.ServiceError as exc:
        raise Http404(exc.detail) from None
    if _target(request) == "bulk-progress":
        response = render(request, "runs/bulk_progress.html#progress", {"bulk": bulk_action})
        if bulk_action.status == "done":
            response.status_code = HTMX_STOP_POLLING  # the action is over: stop polling
        return response
    return render(request, "runs/bulk_progress.html", {"bulk": bulk_action})

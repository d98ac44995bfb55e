"""Saved views on the runs page: the list of a user's views with their counts, the form that saves the page's
filter as a view (POST /runs/views/), and a view's deletion (POST /runs/views/<id>/delete/)."""

# The same services as the API's /views calls; a refusal (a blank or taken name, a group the user is not in) comes
# back to the runs page as a message, never a 500.

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse

from .. import attributes, search, selectors, services
from .access import can_operate, operator

# The runs page's filters a view keeps (the page's own view, sort and paging are not filters).
KEPT = ("status", "workflow", "parent", "stuck", "q", *search.SEARCH_FILTERS)


def filter_of(filters: dict) -> dict:
    """A view's filter from the runs page's checked filters: the ones set, as GET /runs's query texts."""
    kept = {
        key: value for key, value in filters.items() if value and (key in KEPT or key.startswith(attributes.PREFIX))
    }
    if kept.get("stuck"):
        kept["stuck"] = "true"
    return kept


def views_context(request, filters: dict, *, counted: bool = False) -> dict:
    """What the runs page shows of saved views: the user's (owned or shared), the open one, what the save form
    needs; counted: with their live counts (the list's own request, runs.pages.run_list)."""
    views = []
    for view in selectors.views_visible(user=request.user):
        count, truncated = selectors.view_count(view=view, user=request.user) if counted else (None, False)
        views.append({"view": view, "count": count, "truncated": truncated, "mine": view.owner_id == request.user.pk})
    current = next((v for v in views if str(v["view"].id) == filters.get("view")), None)
    groups = request.user.groups.order_by("name") if can_operate(request.user) and not counted else []
    return {
        "saved_views": views,
        "counted": counted,
        "current_view": current,
        "view_filter": filter_of(filters),
        "groups": [group.name for group in groups],
    }


def _to_list(query: dict | None = None) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("runs:list") + (f"?{urlencode(query)}" if query else ""))


@operator
def view_save(request):
    """Save the filter posted (the runs page's, as hidden fields) under a name, shared with a group when chosen."""
    post = request.POST
    filter = {key: post[key] for key in post if key in KEPT or key.startswith(attributes.PREFIX)}
    try:
        view = services.view_create(
            name=post.get("name", ""), filter=filter_of(filter), owner=request.user, group=post.get("group") or None
        )
    except services.ServiceError as exc:
        messages.error(request, f"View not saved: {exc.detail}")
        return _to_list(filter_of(filter))
    shared = f", shared with {view.group.name}" if view.group else ""
    messages.success(request, f"Saved the view {view.name!r}{shared}")
    return _to_list({"view": view.id})


@operator
def view_delete(request, view_id: int):
    try:
        services.view_delete(view_id=view_id, user=request.user)
    except services.ServiceError as exc:
        messages.error(request, f"View not deleted: {exc.detail}")
    else:
        messages.success(request, "View deleted")
    return _to_list()

"""What a rerun reads: the runs its filter selects, the reruns and their items (runs.services.reruns changes them)."""

import uuid
from datetime import datetime

from django.db.models import Case, Count, IntegerField, Q, Value, When

from ..errors import NotFound
from ..models import Rerun, RerunItem, RerunItemStatus, RerunStatus, RunQuerySet
from .lists import runs_matching
from .views import runs_of_filter


def rerun_runs(
    *,
    status: str,
    workflow: str | None = None,
    step_id: str | None = None,
    error_code: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    view: int | None = None,
) -> RunQuerySet:
    """The root runs a rerun's filter selects (read by runs.services.reruns.rerun_filter), oldest first: the one
    place a rerun's filter becomes runs, for its preview and its start. step_id: the step (or an item of it) the
    run failed in; view: a saved view's runs (runs_of_filter), narrowed by the rest. A child is rerun through
    its root's step, never on its own."""
    runs = runs_matching(
        status=status,
        workflow=workflow,
        error_code=error_code,
        created_after=created_after,
        created_before=created_before,
    ).filter(parent_run__isnull=True)
    if view is not None:
        runs = runs.filter(id__in=runs_of_filter({"view": view}).values("id"))
    if step_id:
        runs = runs.filter(Q(error__step_id=step_id) | Q(error__step_id__startswith=f"{step_id}["))
    return runs.order_by("created_at", "id")


def rerun_get(*, rerun_id) -> Rerun:
    rerun = Rerun.objects.filter(id=rerun_id).first() if _uuid_text(rerun_id) else None
    if rerun is None:
        raise NotFound(f"rerun {rerun_id} does not exist", code="rerun_not_found")
    return rerun


def rerun_list(*, limit: int = 100) -> list[Rerun]:
    """The reruns, running ones first, then the newest."""
    running_first = Case(When(status=RerunStatus.RUNNING, then=Value(0)), default=Value(1), output_field=IntegerField())
    return list(Rerun.objects.order_by(running_first, "-created_at")[:limit])


def rerun_items(*, rerun_id, status: str | None = None, limit: int = 200) -> list[RerunItem]:
    """A rerun's items by position (with their runs and forks), those of one status when given."""
    items = RerunItem.objects.filter(rerun_id=rerun_id).select_related("run", "run__workflow", "fork_run")
    if status is not None:
        items = items.filter(status=status)
    return list(items.order_by("position")[:limit])


def rerun_actions(*, rerun_ids: list) -> dict:
    """{rerun id: {"retry": n, "fork": n}}: how many of each rerun's runs were retried in place and forked."""
    rows = (
        RerunItem.objects.filter(rerun_id__in=rerun_ids, status=RerunItemStatus.RERUN)
        .values_list("rerun_id", "action")
        .annotate(n=Count("id"))
        .order_by()
    )
    found: dict = {}
    for rerun_id, action, n in rows:
        found.setdefault(rerun_id, {})[action] = n
    return found


def rerun_refusals(*, rerun_id, limit: int = 100) -> list[RerunItem]:
    return rerun_items(rerun_id=rerun_id, status=RerunItemStatus.REFUSED, limit=limit)


def _uuid_text(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True

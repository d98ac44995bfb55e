"""Bulk actions over the runs a search matches: previewed, then applied in the background."""

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from pal.clock import db_clock

from .. import selectors
from ..audit import Audit
from ..dispatch import (
    enqueue_bulk,
)
from ..errors import ServiceError
from ..models import (
    FINAL_STATUSES,
    BulkAction,
    BulkStatus,
    RunStatus,
)
from .actions import run_cancel, run_redrive, run_retry

# --- bulk actions ---------------------------------------------------------------------------------

BULK_LIMIT = selectors.COUNT_LIMIT  # the runs of one action: what a saved view's count counts up to, too


def _bulk_candidates(*, action: str, filters: dict):
    """Runs matching the list's filters (runs.selectors.runs_of_filter: {"view": id} names a saved view's) that the
    action can apply to (cancel and re-drive: unfinished; retry: failed)."""
    if action not in BulkAction.ACTIONS:
        raise ServiceError(f"action must be one of {', '.join(BulkAction.ACTIONS)}", code="invalid_action")
    status = filters.get("status")
    if status and status not in RunStatus.values:
        raise ServiceError(f"status must be one of {', '.join(RunStatus.values)}", code="invalid_filter")
    qs = selectors.runs_of_filter(filters, prefix="")  # the list's own filters: named as its query names them
    if action == "retry":
        qs = qs.filter(status=RunStatus.FAILED)
    else:
        qs = qs.exclude(status__in=FINAL_STATUSES)
    return qs.order_by("-created_at", "-id")


def bulk_preview(*, action: str, filters: dict) -> dict:
    """How many runs the action would apply to, and a sample; with a saved view as its target, the view's own
    count beside it (the runs the action cannot apply to are the difference)."""
    ids = list(_bulk_candidates(action=action, filters=filters).values_list("id", flat=True)[: BULK_LIMIT + 1])
    preview: dict[str, Any] = {
        "action": action,
        "count": min(len(ids), BULK_LIMIT),
        "truncated": len(ids) > BULK_LIMIT,
        "sample": [str(i) for i in ids[:20]],
    }
    if filters.get("view") is not None:
        view = selectors.view_get(view_id=filters["view"])
        count, truncated = selectors.view_count(view=view, up_to=BULK_LIMIT)
        preview["view"] = {"id": view.id, "name": view.name, "count": count, "truncated": truncated}
    return preview


def bulk_start(*, action: str, filters: dict, reason: str, by: str, force: bool = False):
    """Fix the matching set now (what the operator previewed) and apply the action in a background task."""
    Audit.of(by=by, reason=reason, action="a bulk action")
    ids = [str(i) for i in _bulk_candidates(action=action, filters=filters).values_list("id", flat=True)[:BULK_LIMIT]]
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            action=action, filters=filters, run_ids=ids, reason=reason, force=force, created_by=by, total=len(ids)
        )
        enqueue_bulk(bulk_id=bulk.id)
    return bulk


class _ClaimTakenOver(Exception):
    """The sweep handed this bulk action to another delivery of its task: undo the run just applied and stop."""


def bulk_apply(*, bulk_id: int) -> None:
    """The task's body: apply the action to each run, journaled per run by its own service; progress as it goes."""
    # Each run's action commits together with the bulk's position and counts, fenced by this delivery's claim. So a
    # delivery that takes over (the sweep sent the task again: the first was lost with the broker, or its worker
    # died) goes on after the last run counted and applies or counts no run twice, and a delivery whose claim was
    # taken over stops without committing the run it was on.
    claim = uuid.uuid4().hex
    if not BulkAction.objects.filter(id=bulk_id, status=BulkStatus.PENDING).update(
        status=BulkStatus.RUNNING, claim=claim, updated_at=db_clock()
    ):
        return  # another delivery of this task holds it, or it is done
    bulk = BulkAction.objects.get(id=bulk_id)
    apply = {
        "cancel": lambda run_id: run_cancel(run_id=run_id, by=bulk.created_by, reason=bulk.reason),
        "redrive": lambda run_id: run_redrive(run_id=run_id, by=bulk.created_by, reason=bulk.reason, force=bulk.force),
        "retry": lambda run_id: run_retry(run_id=run_id, by=bulk.created_by, reason=bulk.reason),
    }[bulk.action]
    done, failed, errors = bulk.done, bulk.failed, list(bulk.errors)
    for position in range(bulk.position, len(bulk.run_ids)):
        run_id = bulk.run_ids[position]
        counted: dict[str, Any] = {"done": done, "failed": failed, "errors": errors}
        try:
            with transaction.atomic():
                try:
                    with transaction.atomic():  # a refusal undoes only what its own service wrote
                        apply(run_id)
                    counted["done"] += 1
                except ServiceError as exc:
                    counted["failed"] += 1
                    if len(errors) < 100:
                        counted["errors"] = [*errors, {"run_id": run_id, "detail": exc.detail, "code": exc.code}]
                if not BulkAction.objects.filter(id=bulk_id, claim=claim).update(
                    position=position + 1, updated_at=db_clock(), **counted
                ):
                    raise _ClaimTakenOver
        except _ClaimTakenOver:
            return
        done, failed, errors = counted["done"], counted["failed"], counted["errors"]
    BulkAction.objects.filter(id=bulk_id, claim=claim).update(
        status=BulkStatus.DONE, finished_at=timezone.now(), updated_at=db_clock()
    )

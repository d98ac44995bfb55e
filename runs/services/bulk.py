"""Bulk actions over the runs a search matches: previewed, then applied in the background."""

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from pal.clock import db_clock

from .. import selectors
from ..audit import Audit
from ..code import is_code
from ..dispatch import (
    enqueue_bulk,
)
from ..errors import NotFound, ServiceError
from ..models import (
    FINAL_STATUSES,
    BulkAction,
    BulkStatus,
    RunStatus,
    Workflow,
)
from .actions import run_cancel, run_redrive, run_retry
from .move import MOVABLE, run_move

# --- bulk actions ---------------------------------------------------------------------------------

BULK_LIMIT = selectors.COUNT_LIMIT  # the runs of one action: what a saved view's count counts up to, too


def _bulk_candidates(*, action: str, filters: dict, version: int | None = None):
    """Runs matching the list's filters (runs.selectors.runs_of_filter: {"view": id} names a saved view's) that the
    action can apply to (cancel and re-drive: unfinished; retry: failed; move: unfinished or failed, not on
    `version` already)."""
    if action not in BulkAction.ACTIONS:
        raise ServiceError(f"action must be one of {', '.join(BulkAction.ACTIONS)}", code="invalid_action")
    status = filters.get("status")
    if status and status not in RunStatus.values:
        raise ServiceError(f"status must be one of {', '.join(RunStatus.values)}", code="invalid_filter")
    qs = selectors.runs_of_filter(filters, prefix="")  # the list's own filters: named as its query names them
    if action == "retry":
        qs = qs.filter(status=RunStatus.FAILED)
    elif action == "move":
        qs = qs.filter(status__in=MOVABLE).exclude(workflow__version=version)
    else:
        qs = qs.exclude(status__in=FINAL_STATUSES)
    return qs.order_by("-created_at", "-id")


def _move_target(filters: dict, version: int | None) -> Workflow:
    """A bulk move's version: of the one workflow all its runs belong to (422 naming the workflows otherwise)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ServiceError("version: a move needs the version to move the runs to", code="invalid_version", status=422)
    movable = selectors.runs_of_filter(filters, prefix="").filter(status__in=MOVABLE)  # on that version already too
    names = list(movable.order_by().values_list("workflow__name", flat=True).distinct()[:6])
    if len(names) > 1:
        shown = ", ".join(sorted(names)[:5]) + (" ..." if len(names) > 5 else "")
        raise ServiceError(
            f"a move takes the runs of one workflow; these are of {shown}: filter by workflow",
            code="mixed_workflows",
            status=422,
        )
    name = names[0] if names else None
    target = Workflow.objects.filter(name=name, version=version).first() if name else None
    if name and target is None:
        raise NotFound(f"workflow {name!r} has no version {version}", code="version_not_found")
    if target is not None and is_code(target.definition):
        raise ServiceError(
            f"{target} is a Python workflow: its runs cannot move", code="not_a_json_workflow", status=422
        )
    return target  # type: ignore[return-value]  # None only when no run matches: nothing to move


def bulk_preview(*, action: str, filters: dict, version: int | None = None) -> dict:
    """How many runs the action would apply to, and a sample; with a saved view as its target, the view's own
    count beside it (the runs the action cannot apply to are the difference). A move names its workflow and
    version, and refuses a set of runs of several workflows (422 mixed_workflows)."""
    candidates = _bulk_candidates(action=action, filters=filters, version=version)
    target = _move_target(filters, version) if action == "move" else None
    ids = list(candidates.values_list("id", flat=True)[: BULK_LIMIT + 1])
    preview: dict[str, Any] = {
        "action": action,
        "count": min(len(ids), BULK_LIMIT),
        "truncated": len(ids) > BULK_LIMIT,
        "sample": [str(i) for i in ids[:20]],
    }
    if action == "move":
        preview.update(workflow=target.name if target else None, version=version)
    if filters.get("view") is not None:
        view = selectors.view_get(view_id=filters["view"])
        count, truncated = selectors.view_count(view=view, up_to=BULK_LIMIT)
        preview["view"] = {"id": view.id, "name": view.name, "count": count, "truncated": truncated}
    return preview


def bulk_start(*, action: str, filters: dict, reason: str, by: str, force: bool = False, version: int | None = None):
    """Fix the matching set now (what the operator previewed) and apply the action in a background task."""
    Audit.of(by=by, reason=reason, action="a bulk action")
    candidates = _bulk_candidates(action=action, filters=filters, version=version)
    if action == "move":
        _move_target(filters, version)
    else:
        version = None
    ids = [str(i) for i in candidates.values_list("id", flat=True)[:BULK_LIMIT]]
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            action=action,
            filters=filters,
            run_ids=ids,
            reason=reason,
            force=force,
            version=version,
            created_by=by,
            total=len(ids),
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
        "move": lambda run_id: run_move(
            run_id=run_id, version=bulk.version or 0, audit=Audit(by=bulk.created_by, why=bulk.reason)
        ),
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

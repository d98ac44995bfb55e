"""The REST API's move (docs/reference/api.md, "Moves"): POST /runs/{id}/move previews moving a run to another version
of its workflow (dry_run) or makes the move."""

# An operator's call, checked before the body (tokens.auth). A move without a reason is refused first (400
# reason_required); then 404 run_not_found, 422 not_a_json_workflow, 409 same_version, 404 version_not_found,
# 409 run_ended, and for the move itself 409 lease_held.

from typing import Any
from uuid import UUID

from ninja import Field, Router, Schema

from tokens.auth import operator

from .. import services
from ..audit import Audit
from .runs import run_out
from .schemas import WRITE, RunOut, Strict

router = Router(tags=["actions"])


class MoveIn(Strict):
    version: int = Field(..., ge=1, description="the version of the run's workflow to move to")
    reason: str = Field("", max_length=2000, description="why (journaled with your name); needed unless dry_run")
    dry_run: bool = Field(False, description="answer the preview; change nothing")


class MoveOut(Schema):
    run_id: UUID
    workflow: str
    status: str
    from_version: int
    to_version: int
    applied: bool = Field(..., description="false for a dry run")
    reused: list[dict[str, Any]] = Field(
        ..., description="steps carried over: {step_id, kind, attempt, phase: completed|skipped|waiting}"
    )
    rerun: list[dict[str, Any]] = Field(
        ...,
        description="steps that run again: {step_id, kind, attempt, had, why, same_key}; why: input_changed, "
        "kind_changed, unrenderable, items_changed, when_true, reads_rerun (a new attempt and key); failed (as its "
        "retry would); resumes (it had started: the same attempt and key)",
    )
    new: list[dict[str, Any]] = Field(..., description="steps the run's version did not have: {step_id, kind, attempt}")
    pending: list[dict[str, Any]] = Field(..., description="steps of both versions not begun yet")
    removed: list[dict[str, Any]] = Field(..., description="steps the new version has not: {step_id, kind, phase}")
    side_effects: list[dict[str, Any]] = Field(
        ..., description="keys deliver steps will claim: {key, step_id, channel, why}"
    )
    open_side_effects: list[dict[str, Any]] = Field(..., description="claimed or unconfirmed effects of the run")
    diverging: list[dict[str, Any]] = Field(..., description="{step_id, code, why}: what the journal holds differs")
    wakes: bool = Field(..., description="a waiting run goes on at once (it has work before or instead of its wait)")
    held: dict[str, Any] | None = Field(..., description="a dry run's: the lease of a worker walking it (a move: 409)")
    run: RunOut | None = Field(None, description="the run after the move (absent for a dry run)")


@router.post(
    "/runs/{id}/move",
    auth=operator,
    response={200: MoveOut, **WRITE},
    summary="Preview (dry_run) or make the move of a run to another version of its workflow",
)
def run_move(request, id: UUID, body: MoveIn):
    if body.dry_run:
        return services.run_move_preview(run_id=id, version=body.version)
    audit = Audit.of(by=request.auth.get_username(), reason=body.reason, action="a move")
    applied = services.run_move(run_id=id, version=body.version, audit=audit)
    return {**applied, "run": run_out(services.run_get(run_id=id))}

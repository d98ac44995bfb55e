"""The REST API's inbox (docs/reference/api.md, "Decisions"): GET /decisions, every open decision of every run."""

# A viewer reads it; deciding an approval is POST /runs/{id}/approvals/{step_id} (an operator, its assignee).

from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from django.urls import reverse
from ninja import Field, Query, Router, Schema

from tokens.auth import viewer

from .. import attributes, selectors
from .schemas import ErrorOut

router = Router(tags=["decisions"])

READ = {code: ErrorOut for code in (401, 403, 422)}


class DecisionOut(Schema):
    kind: Literal["approval", "tool_call", "budget", "nondeterminism"] = Field(
        ...,
        description="an approval step's, an agent loop's tool call, a reached budget, a Python workflow's code that "
        "diverged",
    )
    run_id: UUID
    parent_run_id: UUID | None
    workflow: str
    version: int
    step_id: str | None = Field(..., description="the approval's step (an item, `step[3]`; a tool call, `step[1.2]`)")
    attempt: int | None
    prompt: str | None
    opened_at: datetime = Field(..., description="when it opened (by the database's clock)")
    deadline: datetime | None = Field(..., description="an approval with timeout_seconds: when the engine decides it")
    assign: dict[str, str] | None = Field(
        ..., description='{"user": NAME} or {"group": NAME}: only they (and superusers) decide'
    )
    form: dict[str, Any] | None = Field(..., description="the JSON Schema of the answer")
    choices: list[str] | None
    on_timeout: Any = None
    tool: str | None = Field(None, description="a tool call's tool, with its arguments")
    arguments: Any = None
    waiting_on: dict[str, Any] = Field(..., description="the run's wait, as the run's waiting_on lists it")
    decide: str | None = Field(
        ..., description="the call that decides an approval (POST, with {approved | answer | choice})"
    )
    page: str = Field(..., description="the run's page")


class DecisionListOut(Schema):
    items: list[DecisionOut]
    count: int


def _out(decision: selectors.Decision) -> dict:
    wait, run = decision.wait, decision.run
    approval = decision.kind in ("approval", "tool_call")
    return {
        "kind": decision.kind,
        "run_id": run.id,
        "parent_run_id": run.parent_run_id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "step_id": wait.get("step_id"),
        "attempt": wait.get("attempt"),
        "prompt": wait.get("prompt"),
        "opened_at": decision.opened_at,
        "deadline": decision.deadline,
        "assign": wait.get("assign"),
        "form": wait.get("form"),
        "choices": wait.get("choices"),
        "on_timeout": wait.get("on_timeout"),
        "tool": wait.get("tool"),
        "arguments": wait.get("arguments"),
        "waiting_on": wait,
        "decide": f"/api/v1/runs/{run.id}/approvals/{wait.get('step_id')}" if approval else None,
        "page": reverse("runs:detail", args=[run.id]),
    }


@router.get(
    "/decisions",
    auth=viewer,
    response={200: DecisionListOut, **READ},
    summary="The inbox: every open decision of every run (approvals, tool calls, budgets, diverged code)",
    description="Also `attr.NAME=VALUE` (any number, AND-ed): decisions of runs whose attribute NAME has this value.",
)
def decision_list(
    request,
    assignee: str = Query("", max_length=150, description='"me" (your name and groups), a user or a group name'),
    workflow: str = Query("", max_length=64),
    kind: Literal["", "approval", "tool_call", "budget", "nondeterminism"] = Query(""),
    order: Literal["oldest", "newest"] = Query("oldest"),
    older_than: int | None = Query(None, ge=0, le=366 * 86_400, description="open at least this many seconds"),
    limit: int = Query(200, ge=1, le=500),
):
    decisions = selectors.decisions_open(
        workflow=workflow,
        assignee=assignee,
        user=request.auth,
        kind=kind,
        older_than=timedelta(seconds=older_than) if older_than is not None else None,
        # attr.NAME=VALUE (any number, AND-ed), as GET /runs reads them: names no schema can list.
        attributes=attributes.filters_of(request.GET.items()) or None,
        order=order,
        limit=limit,
    )
    return {"items": [_out(d) for d in decisions], "count": len(decisions)}

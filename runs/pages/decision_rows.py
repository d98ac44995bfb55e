"""An inbox row (/inbox/): one open decision, drawn on the inbox and drawn again after a decision from it (the run
page's approval view answers an htmx post whose target is such a row with this)."""

from django.http import HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse

from .. import explain, selectors

KIND_WORDS = {
    "approval": "approval",
    "tool_call": "tool call",
    "budget": "budget",
    "nondeterminism": "code diverged",
}


def decision_row_context(decision) -> dict:
    """What a row draws: the decision, its kind in words, and for a run parked on what an operator mends, why."""
    why = explain.run_why(decision.run) if decision.kind in ("budget", "nondeterminism") else ""
    return {"d": decision, "kind_words": KIND_WORDS[decision.kind], "why": why}


def decision_row(request, run, *, step_id: str, target: str, notice: dict, decided: bool) -> HttpResponse:
    """The row drawn again after a decision from it: the outcome, or its form again with the refusal."""
    run.refresh_from_db()
    wait = selectors.approval_open(run, step_id)
    decision = selectors.Decision(
        kind="tool_call" if (wait or {}).get("tool") else "approval",
        run=run,
        wait=wait or {"kind": "approval", "step_id": step_id},
        opened_at=run.updated_at,
    )
    context = {
        "row": decision_row_context(decision),
        "notice": notice,
        "decided": decided or wait is None,
        "can_operate": True,
        "target": target,
        "next": reverse("runs:inbox"),
    }
    return HttpResponse(render_to_string("runs/inbox.html#row", context, request=request))

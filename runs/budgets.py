"""A workflow's `budget` (docs/reference/workflows.md): caps on what a run and all its child runs spend, in money
(`max_cost_usd`) and tokens (`max_tokens`), counted from the journal's own figures (the usage and cost of llm_call
and agent outputs, as the receipt counts them). When a cap is reached the next step does not start: the run parks on
{"kind": "budget", ...} until an operator raises the cap (runs.services.run_budget_raise, journaled budget_raised)
or cancels it."""

# A run answers to its own workflow's budget and to every ancestor's: a child of a capped parent stops too when the
# tree's spend reaches the parent's cap (it parks; its parent parks on it).

from typing import Any

from journal.selectors import last_event

from .models import Run
from .selectors import run_usage_rollup

CAPS = ("max_cost_usd", "max_tokens")


def caps_of(run: Run) -> dict[str, Any] | None:
    """The run's caps: its workflow's budget, as raised by the last budget_raised on the run; None without one."""
    budget = (run.workflow.definition or {}).get("budget")
    if not isinstance(budget, dict):
        return None
    caps = {cap: budget.get(cap) for cap in CAPS if budget.get(cap) is not None}
    raised = last_event(run_id=run.id, kind="budget_raised")
    if raised is not None and isinstance(raised.payload, dict):
        caps.update({cap: raised.payload[cap] for cap in CAPS if raised.payload.get(cap) is not None})
    return caps or None


def budget_reached(run: Run, *, extra_tokens: int = 0, extra_cost: float = 0.0) -> dict | None:
    """What the run would wait on before its next step: the first budget of the run or an ancestor whose cap the
    tree's spend (and extra: what a step spent so far, not yet journaled as its output) has reached, as a waiting_on;
    None when every budget has room (or there is none)."""
    holder: Run | None = run
    while holder is not None:
        caps = caps_of(holder)
        if caps:
            spent = dict(run_usage_rollup(holder)["total"])
            spent["tokens"] += extra_tokens
            spent["cost_usd"] = round(spent["cost_usd"] + extra_cost, 10)
            over = [
                cap
                for cap, limit in (("max_cost_usd", "cost_usd"), ("max_tokens", "tokens"))
                if cap in caps and spent[limit] >= caps[cap]
            ]
            if over:
                return {
                    "kind": "budget",
                    "run_id": str(holder.id),
                    "spent": {"cost_usd": spent["cost_usd"], "tokens": spent["tokens"]},
                    **caps,
                    "reached": over,
                }
        holder = (
            Run.objects.select_related("workflow").filter(id=holder.parent_run_id).first()
            if holder.parent_run_id
            else None
        )
    return None


def has_budget(run: Run) -> bool:
    """Whether the run or an ancestor has a budget (the walk checks it before each step only then)."""
    if isinstance((run.workflow.definition or {}).get("budget"), dict):
        return True
    parent_id = run.parent_run_id
    while parent_id:
        parent = Run.objects.select_related("workflow").filter(id=parent_id).first()
        if parent is None:
            return False
        if isinstance((parent.workflow.definition or {}).get("budget"), dict):
            return True
        parent_id = parent.parent_run_id
    return False

"""What a run spent, in tokens and dollars: the one rule that every count of spend uses (the receipt, compare, budgets,
the run page's header, a step's detail and /workflows/' cost charts; tests/runs/test_spend_agrees.py)."""

# An attempt spent the usage its step_completed output carries when its step is an llm_call or an agent. Each item of
# a for_each step ("read[3]") is an attempt of its own, counted once; the for_each step's own row (the list of its
# items' outputs) is not counted again. A fork's step taken from its original (reused_from) made no call: it spent
# nothing. A child_run's output is its child's, counted in the child. A usage without a cost is priced by its model
# (PAL_LLM_PRICES).

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from journal.models import JournalEvent
from journal.receipts import ITEM_ID, USAGE_KINDS, usage_of

# The step kinds before the providers: providers.base imports steps.base, whose package imports llm, which imports
# providers.base; entered from here first, that cycle would find providers.base half made.
from . import steps as _step_kinds  # noqa: F401
from .providers.base import cost_usd


@dataclass(frozen=True)
class Spend:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Spend") -> "Spend":
        return Spend(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            round(self.cost_usd + other.cost_usd, 10),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
        }


NOTHING = Spend()


def steps_by_id(definition: Any) -> dict[str, dict]:
    steps = definition.get("steps") if isinstance(definition, dict) else None
    steps = steps if isinstance(steps, list) else []
    return {s["id"]: s for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)}


def step_of(steps: dict[str, dict], step_id: str | None) -> dict | None:
    """The declared step of a journal step id: the step itself, or for an item "read[3]" its for_each step."""
    if step_id is None:
        return None
    if step_id in steps:
        return steps[step_id]
    item = ITEM_ID.match(step_id)
    return steps.get(item["step"]) if item else None


def attempt_spend(step: dict | None, output: Any, *, reused: bool = False) -> Spend:
    """The spend of one completed attempt (a step's or an item's) of the declared `step`: the rule above."""
    if reused or not isinstance(step, dict) or step.get("kind") not in USAGE_KINDS or not isinstance(output, dict):
        return NOTHING
    prompt, completion, cost = usage_of(output)
    if not cost and (prompt or completion):
        model = step.get("model") if isinstance(step.get("model"), str) else output.get("model")
        cost = cost_usd(model, prompt, completion) if isinstance(model, str) else 0.0
    return Spend(prompt, completion, cost)


def runs_spend(definitions: dict[Any, Any]) -> dict[Any, Spend]:
    """Each run's own spend ({run id: its workflow's definition} in, {run id: Spend} out), read lean: the usage
    fields of the step_completed rows of the steps and items that can spend, in one query by run."""
    spent = dict.fromkeys(definitions, NOTHING)
    declared = {run_id: steps_by_id(definition) for run_id, definition in definitions.items()}
    costly = {
        run_id: [sid for sid, step in steps.items() if step.get("kind") in USAGE_KINDS]
        for run_id, steps in declared.items()
    }
    ids = {sid for sids in costly.values() for sid in sids}
    if not ids:
        return spent
    # The items of a for_each step are "step[index]": by prefix, which the (run_id, seq) key's rows are filtered on.
    which = Q(step_id__in=ids)
    for sid in {sid for run_id, sids in costly.items() for sid in sids if "for_each" in declared[run_id][sid]}:
        which |= Q(step_id__startswith=f"{sid}[")
    rows = (
        JournalEvent.objects.filter(which, run_id__in=[run_id for run_id, sids in costly.items() if sids])
        .filter(kind="step_completed")
        .order_by("run_id", "seq")
        .values_list(
            "run_id",
            "step_id",
            "attempt",
            "payload__output__usage__prompt_tokens",
            "payload__output__usage__completion_tokens",
            "payload__output__cost_usd",
            "payload__output__model",
            "payload__reused_from",
        )
    )
    last: dict[tuple, Spend] = {}  # an attempt's last step_completed counts, as in the receipt
    for run_id, step_id, attempt, prompt, completion, cost, model, reused in rows:
        output = {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}, "cost_usd": cost}
        if model is not None:
            output["model"] = model
        step = step_of(declared[run_id], step_id)
        last[(run_id, step_id, attempt)] = attempt_spend(step, output, reused=isinstance(reused, dict))
    for (run_id, _, _), spend in last.items():
        spent[run_id] = spent[run_id] + spend
    return spent


def total(spends: Iterable[Spend]) -> Spend:
    out = NOTHING
    for spend in spends:
        out = out + spend
    return out

"""One rule of spend (runs.spend; issue 23, section 2): the receipt, compare, the budget's count (the run page's
header), a step's detail and /workflows/' cost all count a fan-out's items, each once, and count nothing for a
fork's reused steps; a fork's budget does not charge it for them."""

from decimal import Decimal

import pytest

from journal.models import JournalEvent
from runs.budgets import budget_reached
from runs.compare import run_compare
from runs.models import RunStatus
from runs.receipts import run_receipt
from runs.selectors import run_usage_rollup
from runs.services import run_budget_raise, run_fork, workflow_create
from runs.step_detail import step_detail
from runs.workflow_rollups import run_costs
from tests.helpers import drive_to_end, make_run

pytestmark = pytest.mark.django_db

ITEMS = ["alpha beta", "gamma delta epsilon", "zeta", "eta theta iota kappa"]


def llm(step_id: str, prompt: str, **extra) -> dict:
    return {"id": step_id, "kind": "llm_call", "provider": "fake", "model": "gpt-4o-mini", "prompt": prompt, **extra}


def called(run) -> tuple[int, int, Decimal]:
    """What the run's own calls spent, from its step_completed rows (the truth every count must give): each model
    call's output once, a fork's reused rows not, a for_each step's own row (its items' list) not."""
    prompt = completion = 0
    cost = Decimal(0)
    for event in JournalEvent.objects.filter(run_id=run.id, kind="step_completed"):
        output = event.payload.get("output")
        if isinstance(output, dict) and "usage" in output and "reused_from" not in event.payload:
            prompt += output["usage"]["prompt_tokens"]
            completion += output["usage"]["completion_tokens"]
            cost += Decimal(repr(output["cost_usd"]))
    return prompt, completion, cost


def counts(run) -> dict[str, tuple[int, int, Decimal]]:
    """The run's own spend as each user of the rule counts it."""
    receipt = run_receipt(run_id=run.id, sign=False)["totals"]
    compared = run_compare(a=run.id, b=run.id)["totals"]["a"]
    rollup = run_usage_rollup(run)["own"]
    detail = [
        attempt
        for step in run.workflow.definition["steps"]
        for attempt in step_detail(run=run, step_id=step["id"])["attempts"]
    ]
    return {
        "receipt": (receipt["prompt_tokens"], receipt["completion_tokens"], Decimal(receipt["cost_usd"])),
        "compare": (compared["prompt_tokens"], compared["completion_tokens"], Decimal(repr(compared["cost_usd"]))),
        "budget": (rollup["prompt_tokens"], rollup["completion_tokens"], Decimal(repr(rollup["cost_usd"]))),
        "step detail": (
            sum(a["prompt_tokens"] for a in detail),
            sum(a["completion_tokens"] for a in detail),
            sum((Decimal(repr(a["cost_usd"])) for a in detail), Decimal(0)),
        ),
        "/workflows/ cost": (
            rollup["prompt_tokens"],
            rollup["completion_tokens"],
            Decimal(repr(run_costs([(run.id, run.workflow_id)])[run.id])),
        ),
    }


def test_receipt_compare_budget_step_detail_and_charts_count_a_fan_outs_items_alike():
    run = make_run(
        steps=[
            llm("plan", "Plan the reading"),
            llm("read", "Read {{ item }}", for_each="{{ input.items }}", max_concurrency=2),
            {"id": "done", "kind": "tool_call", "tool": "echo", "args": {"ok": True}},
        ],
        input={"items": ITEMS},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    truth = called(run)
    assert truth[0] > 0 and truth[2] > 0
    assert counts(run) == dict.fromkeys(counts(run), truth)


def test_a_forks_reused_steps_cost_nothing_in_its_receipt_compare_and_budget():
    plan_prompt = " ".join(f"word{i}" for i in range(40))  # the reused step is the expensive one
    workflow = workflow_create(
        definition={
            "name": "forked-spend",
            "budget": {"max_tokens": 1},  # reached by the first call: the original needs a raise to go on
            "steps": [
                llm("plan", plan_prompt),
                llm("read", "Read {{ item }}", for_each="{{ input.items }}"),
                llm("sum", "Sum up {{ input.tone }}"),
            ],
        }
    )
    original = make_run(workflow=workflow, input={"items": ITEMS, "tone": "dry"})
    drive_to_end(original)
    assert original.status == RunStatus.WAITING and original.waiting_on["kind"] == "budget"
    run_budget_raise(run_id=original.id, by="ops", reason="worth it", max_tokens=100_000)
    drive_to_end(original)
    assert original.status == RunStatus.SUCCEEDED

    fork = run_fork(
        run_id=original.id, from_step="sum", input={"items": ITEMS, "tone": "warm"}, reason="try warm", by="ops"
    )
    assert budget_reached(fork) is None  # plan and read were not called again: nothing spent yet
    drive_to_end(fork)

    # Its own budget (max_tokens 1, never raised) let `sum` start: the reused steps were not charged to it.
    assert fork.status == RunStatus.SUCCEEDED, fork.waiting_on
    truth = called(fork)
    summed = JournalEvent.objects.get(run_id=fork.id, kind="step_completed", step_id="sum").payload["output"]
    assert truth[:2] == (summed["usage"]["prompt_tokens"], summed["usage"]["completion_tokens"])
    assert counts(fork) == dict.fromkeys(counts(fork), truth)
    plan_side = next(s for s in run_compare(a=original.id, b=fork.id)["steps"] if s["step_id"] == "plan")
    assert plan_side["a"]["tokens"] > 0 and plan_side["b"]["tokens"] == 0 and plan_side["b"]["cost_usd"] == 0

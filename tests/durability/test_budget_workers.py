"""A workflow's budget on real workers (issue 14): two worker processes, the local model provider. When the spend
reaches a cap the next step does not start: the run waits on its budget and the provider sees no further call; raising
the cap lets it finish, each call made once under its key. A cap counts the child runs: a child's spend stops its
parent's next step."""

import pytest

from runs.models import Run, RunStatus
from runs.services import run_budget_raise, run_create, workflow_create
from tests.helpers import QUICK, describe, key, llm, wait_for_end, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CAP = 30  # tokens: the short call stays under it, the long one goes over
LONG = " ".join(f"word{i}" for i in range(60))  # 60 prompt tokens at the provider


def waits_on_budget(run: Run) -> Run:
    wait_until(
        lambda: Run.objects.filter(id=run.id, status=RunStatus.WAITING).exists(),
        timeout=90,
        what=f"run {run.id} to wait",
        explain=lambda: describe(run),
    )
    run.refresh_from_db()
    return run


@pytest.fixture
def two_workers(celery_workers, llm_provider):
    llm_provider.reply = "ok"  # one completion token a call: the prompt decides the spend
    for name in ("budget-a", "budget-b"):
        celery_workers(llm_provider.env(), name=name, **QUICK)
    return llm_provider


def test_the_third_call_waits_on_the_cap_the_second_reached_until_an_operator_raises_it(two_workers):
    provider = two_workers
    workflow_create(
        definition={
            "name": "three-calls",
            "budget": {"max_tokens": CAP},
            "steps": [llm("short", "hello there"), llm("long", LONG), llm("last", "and finally")],
        }
    )
    run, _ = run_create(workflow_name="three-calls", input={})

    run = waits_on_budget(run)

    assert (run.waiting_on["kind"], run.waiting_on["reached"]) == ("budget", ["max_tokens"]), describe(run)
    assert run.waiting_on["spent"]["tokens"] >= CAP
    assert len(provider.calls) == 2  # the third call did not start

    run_budget_raise(run_id=run.id, by="otto", reason="worth finishing", max_tokens=10 * CAP)
    run = wait_for_end(run, timeout=90)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert len(provider.calls) == 3
    assert provider.billed == {key(run, step): 1 for step in ("short", "long", "last")}  # each key once


def test_a_childs_spend_stops_its_parents_next_step_until_the_cap_is_raised(two_workers):
    provider = two_workers
    workflow_create(definition={"name": "talky-child", "steps": [llm("speak", LONG)]})
    workflow_create(
        definition={
            "name": "capped-parent",
            "budget": {"max_tokens": CAP},
            "steps": [
                {"id": "kid", "kind": "child_run", "workflow": "talky-child", "input": {}},
                llm("after", "and finally"),
            ],
        }
    )
    parent, _ = run_create(workflow_name="capped-parent", input={})

    parent = waits_on_budget(parent)

    child = Run.objects.get(parent_run_id=parent.id)
    assert child.status == RunStatus.SUCCEEDED, describe(child)
    assert (parent.waiting_on["kind"], parent.waiting_on["run_id"]) == ("budget", str(parent.id)), describe(parent)
    assert len(provider.calls) == 1  # the child's call only: the parent's next step did not start

    run_budget_raise(run_id=parent.id, by="otto", reason="the child was worth it", max_tokens=10 * CAP)
    parent = wait_for_end(parent, timeout=90)

    assert parent.status == RunStatus.SUCCEEDED, describe(parent)
    assert provider.billed == {key(child, "speak"): 1, key(parent, "after"): 1}


def test_a_cap_stops_a_fan_out_of_model_calls_part_way_and_a_raise_finishes_it(two_workers):
    provider = two_workers
    items = [f"item{i} " + " ".join(f"w{j}" for j in range(8)) for i in range(8)]  # about 11 tokens a call
    workflow_create(
        definition={
            "name": "capped-fan-out",
            "budget": {"max_tokens": CAP},
            "steps": [
                {**llm("read", "Read {{ item }}"), "for_each": "{{ input.items }}", "max_concurrency": 1},
            ],
        }
    )
    run, _ = run_create(workflow_name="capped-fan-out", input={"items": items})

    run = waits_on_budget(run)

    # The items' spend counts: the cap stops the fan-out after the calls that reached it, not after all eight.
    assert (run.waiting_on["kind"], run.waiting_on["reached"]) == ("budget", ["max_tokens"]), describe(run)
    made = len(provider.calls)
    assert 1 < made < len(items), describe(run)
    assert run.waiting_on["spent"]["tokens"] >= CAP
    print(f"the cap of {CAP} tokens stopped the fan-out after {made} of {len(items)} calls")

    run_budget_raise(run_id=run.id, by="otto", reason="read them all", max_tokens=100 * CAP)
    run = wait_for_end(run, timeout=90)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert provider.billed == {f"{run.id}:read[{i}]:1": 1 for i in range(len(items))}  # each item's key once
    assert len(provider.calls) == len(items)

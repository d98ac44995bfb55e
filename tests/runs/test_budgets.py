"""A workflow's budget (issue 14): when the tree's spend reaches a cap the next step does not start and the run
waits on its budget; raising the cap (journaled budget_raised with who and why) lets it go on."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunStatus
from runs.services import Conflict, ServiceError, run_budget_raise, workflow_create
from tests.helpers import drive_to_end, events, make_run, step_events

pytestmark = pytest.mark.django_db


def llm(step_id: str, prompt: str) -> dict:
    return {"id": step_id, "kind": "llm_call", "provider": "fake", "model": "gpt-4o-mini", "prompt": prompt}


def tokens_of(run) -> list[int]:
    usage = [e.payload["output"]["usage"] for e in step_events(run, "step_completed")]
    return [u["prompt_tokens"] + u["completion_tokens"] for u in usage]


def capped(max_tokens: int, steps: list[dict], name: str = "capped"):
    return workflow_create(definition={"name": name, "budget": {"max_tokens": max_tokens}, "steps": steps})


def test_a_cap_reached_by_the_second_call_holds_the_third_until_an_operator_raises_it():
    probe = make_run(steps=[llm("a", "one two"), llm("b", "three four")])
    drive_to_end(probe)
    first_two = sum(tokens_of(probe))
    workflow = capped(first_two, [llm("a", "one two"), llm("b", "three four"), llm("c", "five six")])
    run = make_run(workflow=workflow)

    drive_to_end(run)

    assert run.status == RunStatus.WAITING
    assert (run.waiting_on["kind"], run.waiting_on["reached"]) == ("budget", ["max_tokens"])
    assert [e.step_id for e in step_events(run, "step_completed")] == ["a", "b"]  # c did not start
    assert f"{first_two} of max_tokens {first_two}" in run_why(run)

    run_budget_raise(run_id=run.id, by="otto", reason="worth it", max_tokens=first_two * 10)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    (raised,) = step_events(run, "budget_raised")
    assert (raised.payload["max_tokens"], raised.payload["by"], raised.payload["why"]) == (
        first_two * 10,
        "otto",
        "worth it",
    )


def test_a_parents_cap_counts_its_child_runs_and_stops_the_child_too():
    workflow_create(definition={"name": "talky", "steps": [llm("x", "alpha beta"), llm("y", "gamma delta")]})
    workflow = capped(1, [{"id": "kid", "kind": "child_run", "workflow": "talky", "input": {}}], name="parent-capped")
    parent = make_run(workflow=workflow)

    drive_to_end(parent)

    child = Run.objects.get(parent_run_id=parent.id)
    assert child.status == RunStatus.WAITING and child.waiting_on["run_id"] == str(parent.id)
    assert parent.status == RunStatus.WAITING and parent.waiting_on["kind"] == "child"
    assert [e.step_id for e in step_events(child, "step_completed")] == ["x"]  # y waits on the parent's cap

    run_budget_raise(run_id=parent.id, by="otto", reason="let it finish", max_tokens=10_000)
    drive_to_end(parent)

    child.refresh_from_db()
    assert (parent.status, child.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)


def test_a_budget_change_needs_a_reason_a_cap_and_a_run_with_a_budget():
    run = make_run(workflow=capped(5, [llm("a", "hi")], name="small"))
    with pytest.raises(ServiceError) as no_reason:
        run_budget_raise(run_id=run.id, by="otto", reason=" ", max_tokens=10)
    with pytest.raises(ServiceError) as no_cap:
        run_budget_raise(run_id=run.id, by="otto", reason="more")
    plain = make_run(steps=[llm("a", "hi")])
    with pytest.raises(Conflict) as no_budget:
        run_budget_raise(run_id=plain.id, by="otto", reason="more", max_tokens=10)
    assert (no_reason.value.code, no_cap.value.code, no_budget.value.code) == (
        "reason_required",
        "invalid_budget",
        "no_budget",
    )
    assert [e.kind for e in events(run)] == ["run_created"]

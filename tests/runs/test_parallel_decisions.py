"""Three approvals of one graph open at once, answered in any order (issue 28): each answer lands on its own branch.
100 trials, each a random order of decisions with the run driven (or not) between them, so some decisions wake the
parked run and others are journaled while it is running (a branch decided while the walk goes on)."""

import random

import pytest

from runs.models import RunStatus
from runs.services import approval_decide
from tests.helpers import drive, echo_step, kinds, make_run, make_workflow, step_events

pytestmark = pytest.mark.django_db

BRANCHES = ("a", "b", "c")
CHOICES = ["x", "y", "z"]
TRIALS = 100


def parallel_workflow():
    steps = [echo_step("start", go=True)]
    for name in BRANCHES:
        steps.append(
            {
                "id": f"ask_{name}",
                "kind": "approval",
                "prompt": f"Branch {name}?",
                "choices": CHOICES,
                "needs": ["start"],
            }
        )
        steps.append(
            {**echo_step(f"then_{name}", picked=f"{{{{ steps.ask_{name}.output.choice }}}}"), "needs": [f"ask_{name}"]}
        )
    steps.append(
        {
            **echo_step("join", **{name: f"{{{{ steps.then_{name}.output.picked }}}}" for name in BRANCHES}),
            "needs": [f"then_{name}" for name in BRANCHES],
        }
    )
    return make_workflow(steps=steps)


def test_three_parallel_approvals_answered_in_random_order_each_land_on_their_own_branch():
    workflow = parallel_workflow()
    rng = random.Random(28)
    in_walk = 0
    for trial in range(TRIALS):
        run = make_run(workflow=workflow)
        drive(run)
        assert run.status == RunStatus.WAITING, kinds(run)
        assert {w["step_id"] for w in run.waiting_on["waits"]} == {f"ask_{name}" for name in BRANCHES}
        answers = {name: rng.choice(CHOICES) for name in BRANCHES}
        order = rng.sample(BRANCHES, len(BRANCHES))
        for name in order:
            run.refresh_from_db()
            in_walk += run.status == RunStatus.RUNNING  # woken by the last decision and not driven yet
            approval_decide(run_id=run.id, step_id=f"ask_{name}", approved=True, by=f"op-{name}", choice=answers[name])
            if rng.random() < 0.5:
                drive(run)
        for _ in range(10):
            if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
                break
            drive(run)

        assert run.status == RunStatus.SUCCEEDED, (trial, order, run.error, kinds(run))
        assert run.output == answers, (trial, order)
        for name in BRANCHES:
            (decided,) = step_events(run, "approval_decided", f"ask_{name}")
            assert (decided.payload["choice"], decided.payload["by"]) == (answers[name], f"op-{name}"), trial
            (then,) = step_events(run, "step_completed", f"then_{name}")
            assert then.payload["output"] == {"picked": answers[name]}, trial
    print(f"{TRIALS} trials; {in_walk} decisions taken while the run was running (journaled for its walk)")
    assert in_walk > 0  # the random drives made both paths happen

"""A concurrency limit through a wake-up on real workers (issue 14): with max_runs 1, a run whose approval is decided
while another run of its group holds the slot stays queued, saying why, until that run ends; then it goes on. The
journal's intervals never show two running at once."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunStatus
from runs.services import approval_decide, run_create, workflow_create
from tests.helpers import QUICK, describe, echo, events, llm, wait_for_end, wait_until
from tests.services.test_concurrency_wakeups import most_running_at_once

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def first_waits_second_holds(celery_workers, llm_provider, *, names: tuple[str, str]) -> tuple[Run, Run]:
    """Two workers and a group of one (workflow "gate"): the first run parked on its approval (its slot given
    back), the second holding the slot inside a model call that takes 5 s (llm_provider.delay)."""
    for name in names:
        celery_workers(llm_provider.env(), name=name, **QUICK)
    workflow_create(
        definition={
            "name": "gate",
            "concurrency": {"max_runs": 1},
            "steps": [
                {"id": "ok", "kind": "approval", "prompt": "go?", "when": "input.ask"},
                llm("work", "do the work"),
                echo("done"),
            ],
        }
    )
    first, _ = run_create(workflow_name="gate", input={"ask": True})
    wait_until(
        lambda: Run.objects.filter(id=first.id, status=RunStatus.WAITING).exists(),
        timeout=60,
        what="the first run to wait on its approval",
        explain=lambda: describe(first),
    )
    llm_provider.delay = 5.0  # the second run's model call holds the slot meanwhile
    second, _ = run_create(workflow_name="gate", input={"ask": False})
    assert llm_provider.request_started.wait(timeout=60), describe(second)
    return first, second


def test_a_run_woken_while_its_group_is_full_waits_queued_until_the_slot_frees(celery_workers, llm_provider):
    first, second = first_waits_second_holds(celery_workers, llm_provider, names=("wake-a", "wake-b"))

    approval_decide(run_id=first.id, step_id="ok", approved=True, by="otto")

    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED, describe(first)
    assert run_why(first).startswith("concurrency gate:: 1 of 1 running")
    llm_provider.delay = 0.0
    first, second = wait_for_end(first, timeout=90), wait_for_end(second, timeout=90)

    assert (first.status, second.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED), describe(first)
    assert most_running_at_once([first, second]) == 1
    second_ended = next(e.created_at for e in events(second) if e.kind == "run_succeeded")
    assert [e.created_at for e in events(first) if e.kind == "run_started"][-1] >= second_ended
    assert len(llm_provider.billed) == 2  # each run's call once


def test_a_child_held_back_by_its_group_starts_when_the_slot_frees_and_its_parent_goes_on(celery_workers, llm_provider):
    for name in ("child-a", "child-b"):
        celery_workers(llm_provider.env(), name=name, **QUICK)
    workflow_create(definition={"name": "scarce", "concurrency": {"max_runs": 1}, "steps": [llm("work", "busy")]})
    workflow_create(
        definition={
            "name": "caller",
            "steps": [{"id": "kid", "kind": "child_run", "workflow": "scarce", "input": {}}, echo("after")],
        }
    )
    llm_provider.delay = 5.0  # the hog's model call holds scarce's only slot meanwhile
    hog, _ = run_create(workflow_name="scarce", input={})
    assert llm_provider.request_started.wait(timeout=60), describe(hog)
    parent, _ = run_create(workflow_name="caller", input={})

    wait_until(
        lambda: Run.objects.filter(id=parent.id, status=RunStatus.WAITING).exists(),
        timeout=60,
        what="the parent to wait on its held-back child",
        explain=lambda: describe(parent),
    )
    child = Run.objects.get(parent_run_id=parent.id)
    assert child.status == RunStatus.QUEUED and run_why(child).startswith("concurrency scarce:: 1 of 1 running")
    llm_provider.delay = 0.0
    hog, parent = wait_for_end(hog, timeout=90), wait_for_end(parent, timeout=90)

    child.refresh_from_db()
    assert (hog.status, child.status, parent.status) == (RunStatus.SUCCEEDED,) * 3, describe(parent)
    assert most_running_at_once([hog, child]) == 1
    assert len(llm_provider.billed) == 2

"""Attributes on real workers (issue 27 section 4): a run's input attribute is there from its creation, a step's
appears in the very commit of that step's step_completed (never one without the other, read as the run goes),
and a kill -9 of the worker later leaves it set once; the run filtered by it through GET /runs's selector."""

import pytest

from runs.models import RunAttribute, RunStatus
from runs.selectors import run_list
from runs.services import run_create, workflow_create
from tests.helpers import QUICK, describe, echo, events, sleep_tool, sweep_until_end, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def attributes_of(run) -> dict:
    return dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "value"))


def test_a_steps_attribute_commits_with_its_step_and_survives_a_kill_9(celery_workers):
    workflow_create(
        definition={
            "name": "attributed-workers",
            "steps": [sleep_tool("warm", 1), echo("classify", tier="{{ input.plan }}"), sleep_tool("hold", 5)],
            "attributes": {"customer": "{{ input.customer }}", "tier": "{{ steps.classify.output.tier }}"},
        }
    )
    run, _ = run_create(workflow_name="attributed-workers", input={"customer": "acme", "plan": "gold"})
    assert attributes_of(run) == {"customer": "acme"}  # from its creation, before any worker took it
    first = celery_workers(name="attrs-a", **QUICK)
    looks = {"before": 0, "after": 0}

    def classified() -> bool:
        # The attribute first, then the journal: an attribute seen means its step_completed is there too; a
        # step_completed seen (read after) means the attribute was written in the same commit.
        has_tier = "tier" in attributes_of(run)
        completed = bool(events(run, "step_completed", "classify"))
        assert not has_tier or completed, describe(run)
        if completed:
            assert "tier" in attributes_of(run), describe(run)
        looks["after" if completed else "before"] += 1
        return completed

    wait_until(classified, timeout=30, what="classify to end", explain=lambda: describe(run))
    assert looks["before"] > 0, "the look began after the step ended: it proves nothing"
    wait_until(lambda: events(run, "step_started", "hold"), timeout=30, what="hold to start")
    first.kill()
    celery_workers(name="attrs-b", **QUICK)
    run = sweep_until_end(run, timeout=90)
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert attributes_of(run) == {"customer": "acme", "tier": "gold"}
    assert RunAttribute.objects.filter(run_id=run.id).count() == 2
    assert [r.id for r in run_list(attributes={"tier": "gold", "customer": "acme"})[0]] == [run.id]

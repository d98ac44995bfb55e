"""A step's attributes are written in the commit of its step_completed (issue 27 section 4): a crash after the step
leaves both, a crash inside it neither, and the re-drive that ends it sets them; a skipped step's, a fan-out's and
a fork's reused steps' too; a Python workflow's attributes= the same way."""

import pytest

from pal.workflows import workflow
from runs.models import Run, RunAttribute
from runs.services import run_fork, workflow_create
from tests.code import sample_workflows
from tests.helpers import Crash, drive, drive_to_end, echo_step, events, make_run, sweep_after_expiry, tool_step

pytestmark = pytest.mark.django_db


def attributes_of(run) -> dict:
    return dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "value"))


def attributed(*steps: dict, **attributes: str):
    return workflow_create(definition={"name": "walked", "steps": list(steps), "attributes": attributes})


def test_a_crash_after_the_step_leaves_its_attribute_with_its_step_completed():
    workflow = attributed(
        echo_step("classify", tier="gold"),
        tool_step("charge", "test_crash_once"),
        tier="{{ steps.classify.output.tier }}",
    )
    run = make_run(workflow=workflow)
    with pytest.raises(Crash):
        drive(run)
    assert [e.step_id for e in events(run, "step_completed")] == ["classify"]
    assert attributes_of(run) == {"tier": "gold"}


def test_a_crash_inside_the_step_leaves_neither_and_the_redrive_sets_it():
    workflow = attributed(
        tool_step("classify", "test_crash_once", {"tier": "gold"}),
        echo_step("reply"),
        tier="{{ steps.classify.output.tier }}",
    )
    run = make_run(workflow=workflow)
    with pytest.raises(Crash):
        drive(run)
    assert events(run, "step_completed") == [] and attributes_of(run) == {}
    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == "succeeded" and attributes_of(run) == {"tier": "gold"}


def test_an_attribute_reading_two_steps_is_set_when_the_second_ends():
    workflow = attributed(
        echo_step("a", x="left"),
        echo_step("b", x="right"),
        tool_step("c", "test_crash_once"),
        pair="{{ steps.a.output.x }}/{{ steps.b.output.x }}",
        first="{{ steps.a.output.x }}",
    )
    run = make_run(workflow=workflow)
    with pytest.raises(Crash):
        drive(run)
    assert attributes_of(run) == {"first": "left", "pair": "left/right"}


def test_a_fan_out_and_a_skipped_step_set_theirs_when_they_end():
    workflow = attributed(
        echo_step("plan", items=[1, 2, 3]),
        {**echo_step("each", n="{{ item }}"), "for_each": "{{ steps.plan.output.items }}"},
        {**echo_step("maybe", said="no"), "needs": ["plan"], "when": "input.go"},
        counted="{{ steps.each.output }}",
        skipped="{{ steps.maybe.output }}",
    )
    run = make_run(workflow=workflow, input={"go": False})
    drive_to_end(run)
    assert attributes_of(run) == {"counted": [{"n": 1}, {"n": 2}, {"n": 3}], "skipped": None}
    assert dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "text"))["skipped"] == "null"


def test_a_fork_starts_with_the_attributes_of_the_steps_it_reuses():
    workflow = attributed(
        echo_step("classify", tier="{{ input.plan }}"),
        echo_step("reply", said="hi"),
        tier="{{ steps.classify.output.tier }}",
        customer="{{ input.customer }}",
    )
    original = make_run(workflow=workflow, input={"customer": "acme", "plan": "gold"})
    drive_to_end(original)
    fork = run_fork(run_id=original.id, from_step="reply", reason="say it again", by="alice")
    assert attributes_of(fork) == {"customer": "acme", "tier": "gold"}  # before its first walk


def test_a_python_workflow_sets_its_attributes_the_same_way():
    run = Run.objects.get(id=sample_workflows.py_attributed.start({"customer": "acme", "text": "urgent: printer"}))
    assert attributes_of(run) == {"customer": "acme"}
    drive_to_end(run)
    assert run.status == "succeeded" and attributes_of(run) == {"customer": "acme", "tier": "gold"}


def test_a_python_workflows_bad_attribute_is_refused_when_registered():
    with pytest.raises(ValueError, match=r"attributes\.Tier"):
        workflow(name="py-bad", attributes={"Tier": "{{ input.t }}"})(lambda ctx, input: None)

"""Typed decisions (issue 28): an approval's form, choices and assignment, checked when the workflow is posted and
when a decision is given; the step's output is the validated answer, and a choice branches the graph."""

import pytest
from django.contrib.auth.models import Group, User

from runs.models import RunStatus
from runs.services import Conflict, ServiceError, approval_decide, workflow_create
from runs.workflows import WorkflowInvalid
from tests.helpers import drive, drive_to_end, echo_step, kinds, make_run, step_events

pytestmark = pytest.mark.django_db

REFUND_FORM = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "minimum": 0, "maximum": 500, "title": "Amount to refund"},
        "reason": {"type": "string", "enum": ["damaged", "late", "other"]},
        "notify_customer": {"type": "boolean"},
        "items": {"type": "integer", "minimum": 1},
    },
    "required": ["amount", "reason"],
}


def approval(step_id="review", **fields) -> dict:
    return {"id": step_id, "kind": "approval", "prompt": "Refund?", **fields}


def waiting(*steps, input=None):
    run = make_run(steps=list(steps), input=input)
    drive(run)
    assert run.status == RunStatus.WAITING, kinds(run)
    return run


def problems_of(*steps) -> list[str]:
    with pytest.raises(WorkflowInvalid) as refused:
        workflow_create(definition={"name": "typed-bad", "steps": list(steps)})
    return [f"{e['loc']}: {e['msg']}" for e in refused.value.errors]


# --- posting the workflow ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"form": {"type": "array"}}, "steps[1] (review).form.type"),
        ({"form": {"type": "object", "properties": {"a": {"type": "date"}}}}, "form.properties.a.type"),
        ({"form": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}, "properties.a.pattern"),
        ({"form": {**REFUND_FORM, "required": ["nope"]}}, "form.required"),
        ({"choices": []}, "steps[1] (review).choices"),
        ({"choices": ["a", "a"]}, "choices"),
        ({"assign": {"team": "billing"}}, "steps[1] (review).assign"),
        ({"assign": {"user": ""}}, "assign.user"),
        ({"on_timeout": "reject"}, "on_timeout"),
        ({"timeout_seconds": 60, "on_timeout": "maybe"}, "on_timeout"),
        ({"timeout_seconds": 60, "on_timeout": {"amount": 1}}, "on_timeout"),
        ({"timeout_seconds": 60, "choices": ["a", "b"], "on_timeout": {"choice": "c"}}, "on_timeout.choice"),
        ({"timeout_seconds": 60, "form": REFUND_FORM, "on_timeout": {"amount": 1}}, "on_timeout.reason"),
        ({"notify": {"sms": "x"}}, "notify"),
        ({"notify": {"webhook": "ftp://x"}}, "notify.webhook"),
        ({"link_decides": True}, "link_decides"),
    ],
)
def test_a_bad_typed_field_is_refused_when_posted_naming_it(fields, where):
    problems = problems_of(echo_step("first", x=1), approval(**fields))

    assert any(where in problem for problem in problems), problems


def test_the_typed_fields_that_fit_are_taken():
    workflow_create(
        definition={
            "name": "typed-good",
            "steps": [
                approval(
                    form=REFUND_FORM,
                    choices=["refund", "replace"],
                    assign={"user": "{{ input.owner }}"},
                    timeout_seconds=3600,
                    on_timeout={"choice": "replace", "amount": 0, "reason": "other"},
                    notify={"email": ["ops@example.com"], "webhook": "https://hooks.example.com/x"},
                    link_decides=True,
                )
            ],
        }
    )


# --- a form's answer -----------------------------------------------------------------------------


def test_the_answer_of_a_form_is_the_steps_output_and_later_steps_read_it():
    run = waiting(approval(form=REFUND_FORM), echo_step("after", amount="{{ steps.review.output.amount }}"))

    approval_decide(
        run_id=run.id, step_id="review", approved=True, by="alice", answer={"amount": 12.5, "reason": "late"}
    )
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"amount": 12.5}
    (decided,) = step_events(run, "approval_decided", "review")
    assert decided.payload["answer"] == {"amount": 12.5, "reason": "late"}
    (completed,) = step_events(run, "step_completed", "review")
    assert completed.payload["output"] == {"amount": 12.5, "reason": "late"}


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"reason": "late"}, "answer.amount"),
        ({"amount": 900, "reason": "late"}, "answer.amount"),
        ({"amount": "ten", "reason": "late"}, "answer.amount"),
        ({"amount": 1, "reason": "bored"}, "answer.reason"),
        ({"amount": 1, "reason": "late", "items": 1.5}, "answer.items"),
        ({"amount": 1, "reason": "late", "colour": "red"}, "answer.colour"),
        (None, "answer.amount"),
    ],
)
def test_an_answer_that_does_not_fit_the_form_is_422_naming_the_field_and_nothing_is_journaled(answer, field):
    run = waiting(approval(form=REFUND_FORM))
    before = kinds(run)

    with pytest.raises(ServiceError) as refused:
        approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", answer=answer)

    assert (refused.value.status, refused.value.code) == (422, "invalid_answer")
    assert refused.value.detail.startswith(field), refused.value.detail
    assert kinds(run) == before


def test_a_rejection_needs_no_answer_and_fails_the_step():
    run = waiting(approval(form=REFUND_FORM))

    approval_decide(run_id=run.id, step_id="review", approved=False, by="alice", comment="no refunds today")
    drive_to_end(run)

    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "approval_rejected"


# --- choices -------------------------------------------------------------------------------------


def branching_run():
    return waiting(
        approval(choices=["refund", "replace", "reject"]),
        {**echo_step("refund", did="refund"), "needs": ["review"], "when": 'steps.review.output.choice == "refund"'},
        {**echo_step("replace", did="replace"), "needs": ["review"], "when": 'steps.review.output.choice == "replace"'},
    )


@pytest.mark.parametrize("choice", ["refund", "replace"])
def test_a_choice_branches_the_graph_through_when(choice):
    run = branching_run()

    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", choice=choice)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    ran = {e.step_id for e in step_events(run, "step_completed") if e.step_id in ("refund", "replace")}
    skipped = {e.step_id for e in step_events(run, "step_skipped")}
    assert ran == {choice} and skipped == {"refund", "replace"} - {choice}
    (completed,) = step_events(run, "step_completed", "review")
    assert completed.payload["output"] == {"approved": True, "choice": choice, "by": "alice", "comment": ""}


@pytest.mark.parametrize("choice", [None, "refunds"])
def test_an_approval_with_choices_needs_one_of_them(choice):
    run = branching_run()

    with pytest.raises(ServiceError) as refused:
        approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", choice=choice)

    assert refused.value.status == 422 and refused.value.detail.startswith("choice")


def test_an_answer_or_a_choice_for_a_plain_approval_is_422():
    run = waiting(approval())

    with pytest.raises(ServiceError) as refused:
        approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", choice="refund")

    assert refused.value.status == 422


# --- assignment ----------------------------------------------------------------------------------


@pytest.fixture
def people(db):
    billing = Group.objects.create(name="billing")
    alice = User.objects.create_user("alice")
    alice.groups.add(billing)
    return {
        "alice": alice,
        "bob": User.objects.create_user("bob"),
        "root": User.objects.create_user("root", is_superuser=True),
    }


@pytest.mark.parametrize(
    ("assign", "allowed", "refused"),
    [
        ({"group": "billing"}, "alice", "bob"),
        ({"user": "bob"}, "bob", "alice"),
        ({"user": "{{ input.owner }}"}, "bob", "alice"),
    ],
)
def test_only_the_assignee_or_a_superuser_may_decide_others_get_403_and_nothing_is_journaled(
    people, assign, allowed, refused
):
    run = waiting(approval(assign=assign), input={"owner": "bob"})
    before = kinds(run)

    with pytest.raises(ServiceError) as denied:
        approval_decide(run_id=run.id, step_id="review", approved=True, by=refused, user=people[refused])

    assert (denied.value.status, denied.value.code) == (403, "not_assignee")
    assert kinds(run) == before
    approval_decide(run_id=run.id, step_id="review", approved=True, by=allowed, user=people[allowed])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED


def test_a_superuser_may_decide_an_approval_assigned_to_others(people):
    run = waiting(approval(assign={"group": "billing"}))

    approval_decide(run_id=run.id, step_id="review", approved=True, by="root", user=people["root"])

    assert step_events(run, "approval_decided", "review")[0].payload["by"] == "root"


def test_the_assignment_is_rendered_from_the_input_when_the_approval_opens():
    run = waiting(approval(assign={"user": "{{ input.owner }}"}), input={"owner": "carol"})

    assert run.waiting_on["assign"] == {"user": "carol"} and run.waiting_on["assign_user"] == "carol"
    (requested,) = step_events(run, "approval_requested", "review")
    assert requested.payload["assign"] == {"user": "carol"}


# --- every decision is tied to its run, step and attempt -----------------------------------------


def test_an_unknown_step_and_a_decided_one_are_409_saying_which():
    run = waiting(approval(), echo_step("after", x=1))

    with pytest.raises(Conflict) as unknown:
        approval_decide(run_id=run.id, step_id="nope", approved=True, by="alice")
    assert unknown.value.code == "not_waiting_on_approval" and "no such step" in unknown.value.detail

    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")
    with pytest.raises(Conflict) as again:
        approval_decide(run_id=run.id, step_id="review", approved=False, by="bob")

    assert again.value.code == "not_waiting_on_approval"
    assert "decided already, approved by alice" in again.value.detail
    assert len(step_events(run, "approval_decided", "review")) == 1

"""POST /runs/{id}/approvals/{step_id} with a typed answer, a choice, an assignment (issue 28), and POST /workflows
refusing a bad approval field naming it."""

import pytest
from django.contrib.auth.models import Group

from journal.models import JournalEvent
from runs.models import RunStatus
from tests.helpers import drive, drive_to_end, make_run

from .conftest import Api, assert_error, make_user, token_for

pytestmark = pytest.mark.django_db

FORM = {
    "type": "object",
    "properties": {"amount": {"type": "number", "maximum": 100}, "reason": {"type": "string"}},
    "required": ["amount"],
}


def waiting_on(**fields):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Refund?", **fields}], input={"owner": "bob"})
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def decided(run) -> int:
    return JournalEvent.objects.filter(run_id=run.id, kind="approval_decided").count()


def test_an_answer_that_fits_the_form_is_the_steps_output(operator):
    run = waiting_on(form=FORM)

    response = operator.post(f"/runs/{run.id}/approvals/review", {"answer": {"amount": 40, "reason": "late"}})

    assert response.status_code == 200, response.content
    drive_to_end(run)
    assert run.output == {"amount": 40, "reason": "late"}


def test_an_answer_that_does_not_fit_is_422_naming_the_field_and_nothing_is_journaled(operator):
    run = waiting_on(form=FORM)

    response = operator.post(f"/runs/{run.id}/approvals/review", {"approved": True, "answer": {"amount": 400}})

    body = assert_error(response, 422, "invalid_answer")
    assert body["detail"].startswith("answer.amount: must be at most 100")
    assert decided(run) == 0


def test_a_choice_outside_the_choices_is_422_and_one_of_them_decides(operator):
    run = waiting_on(choices=["refund", "replace"])

    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"choice": "nope"}), 422, "invalid_answer")
    response = operator.post(f"/runs/{run.id}/approvals/review", {"choice": "replace"})

    assert response.status_code == 200
    drive_to_end(run)
    assert run.output["choice"] == "replace"


def test_a_decision_without_approved_answer_or_choice_is_422(operator):
    run = waiting_on()

    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"comment": "hm"}), 422)


def test_an_operator_who_is_not_the_assignee_gets_403_and_nothing_is_journaled(operator):
    run = waiting_on(assign={"group": "billing"})

    body = assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"approved": True}), 403, "not_assignee")

    assert "group billing" in body["detail"]
    assert decided(run) == 0
    member = make_user("bill", "runs.view_run", "runs.operate")
    member.groups.add(Group.objects.create(name="billing"))
    assert Api(token_for(member)).post(f"/runs/{run.id}/approvals/review", {"approved": True}).status_code == 200
    assert decided(run) == 1


def test_a_template_assignment_names_the_user_from_the_input(operator):
    run = waiting_on(assign={"user": "{{ input.owner }}"})
    bob = Api(token_for(make_user("bob", "runs.view_run", "runs.operate")))

    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"approved": False}), 403, "not_assignee")
    assert bob.post(f"/runs/{run.id}/approvals/review", {"approved": False, "comment": "no"}).status_code == 200


def test_an_unknown_step_and_a_decided_one_are_409_saying_which(operator):
    run = waiting_on()

    unknown = assert_error(operator.post(f"/runs/{run.id}/approvals/nope", {"approved": True}), 409)
    assert "no such step" in unknown["detail"]
    assert operator.post(f"/runs/{run.id}/approvals/review", {"approved": True}).status_code == 200
    body = assert_error(
        operator.post(f"/runs/{run.id}/approvals/review", {"approved": False}), 409, "not_waiting_on_approval"
    )
    assert "decided already, approved by otto" in body["detail"]


def test_a_workflow_with_a_bad_form_is_422_naming_the_step_and_field(operator):
    definition = {
        "name": "typed-api",
        "steps": [
            {"id": "a", "kind": "tool_call", "tool": "echo"},
            {"id": "b", "kind": "tool_call", "tool": "echo"},
            {"id": "review", "kind": "approval", "prompt": "?", "form": {"type": "object", "properties": {}}},
        ],
    }

    response = operator.post("/workflows", definition)

    assert response.status_code == 422
    assert "steps[2] (review).form.properties" in response.content.decode()

"""The run page draws an approval's form (issue 28) server side, as plain HTML that works without JavaScript; a post
is read by the form's types, checked (422 naming the field) and becomes the step's output. Choices are buttons; an
approval assigned to others shows no buttons, and a post from a non-assignee is 403 with a message."""

import re

import pytest
from django.contrib.auth.models import Group

from runs.models import RunStatus
from tests.helpers import drive, drive_to_end, kinds, make_run, step_events

from .conftest import htmx, logged_in, make_user

pytestmark = pytest.mark.django_db

FORM = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "minimum": 0, "maximum": 500, "title": "Amount"},
        "reason": {"type": "string", "enum": ["damaged", "late"]},
        "items": {"type": "integer", "minimum": 1, "default": 1},
        "notify_customer": {"type": "boolean", "description": "send the customer a note"},
        "note": {"type": "string", "maxLength": 200},
    },
    "required": ["amount", "reason"],
}


def waiting(**fields):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Refund order 7?", **fields}])
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def test_the_form_is_drawn_as_html_fields_of_the_right_types(operator):
    run = waiting(form=FORM)

    page = operator.get(f"/runs/{run.id}/").content.decode()

    assert re.search(r'<input type="number" name="answer.amount" step="any" min="0" max="500"[^>]* required>', page)
    assert re.search(r'<select name="answer.reason" required>', page) and '<option value="late">late</option>' in page
    assert re.search(r'<input type="number" name="answer.items" step="1" min="1" value="1">', page)
    assert '<input type="checkbox" name="answer.notify_customer" value="1">' in page
    assert re.search(r'<input type="text" name="answer.note" maxlength="200">', page)
    assert "formnovalidate" in page  # rejecting needs no answer


def test_a_posted_form_without_javascript_decides_with_the_typed_answer(operator):
    run = waiting(form=FORM)

    response = operator.post(
        f"/runs/{run.id}/approvals/review/",
        {
            "answer.amount": "12.5",
            "answer.reason": "late",
            "answer.items": "2",
            "answer.notify_customer": "1",
            "answer.note": "",
            "approved": "1",
            "attempt": "1",
        },
    )

    assert response.status_code == 302
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"amount": 12.5, "reason": "late", "items": 2, "notify_customer": True}


@pytest.mark.parametrize(
    ("posted", "field"),
    [({"answer.amount": "lots", "answer.reason": "late"}, "answer.amount"), ({"answer.amount": "1"}, "answer.reason")],
)
def test_a_posted_answer_that_does_not_fit_is_422_naming_the_field(operator, posted, field):
    run = waiting(form=FORM)
    before = kinds(run)

    response = operator.post(
        f"/runs/{run.id}/approvals/review/", {**posted, "approved": "1"}, headers=htmx("run-actions")
    )

    assert response.status_code == 422
    assert field in response.content.decode()
    assert kinds(run) == before


def test_choices_are_buttons_and_one_decides(operator):
    run = waiting(choices=["refund", "replace"])
    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert '<button class="primary" type="submit" name="choice" value="refund"' in page
    assert 'name="approved" value="1"' not in page  # no plain approve: a choice is the approval

    response = operator.post(f"/runs/{run.id}/approvals/review/", {"choice": "replace"}, headers=htmx("run-actions"))

    assert response.status_code == 200
    assert "Chose &#x27;replace&#x27; for step review" in response.content.decode()
    (decided,) = step_events(run, "approval_decided", "review")
    assert decided.payload["choice"] == "replace"


def test_an_approval_assigned_to_others_shows_no_buttons_and_a_post_is_403_with_nothing_journaled(operator):
    run = waiting(assign={"group": "billing"})

    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert "Only group billing (or a superuser) may decide it." in page
    assert 'name="approved" value="1"' not in page
    before = kinds(run)

    response = operator.post(f"/runs/{run.id}/approvals/review/", {"approved": "1"}, headers=htmx("run-actions"))

    assert response.status_code == 403
    assert "assigned to group billing" in response.content.decode()
    assert kinds(run) == before
    member = make_user("bill", "runs.view_run", "runs.operate")
    member.groups.add(Group.objects.create(name="billing"))
    client = logged_in(member)
    assert 'name="approved" value="1"' in client.get(f"/runs/{run.id}/").content.decode()
    assert (
        client.post(f"/runs/{run.id}/approvals/review/", {"approved": "1"}, headers=htmx("run-actions")).status_code
        == 200
    )

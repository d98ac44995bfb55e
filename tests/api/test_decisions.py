"""GET /decisions: the API's inbox (issue 28), every open decision of every run, filtered by assignee ("me", a user,
a group), workflow, kind and age, oldest or newest first."""

import pytest
from django.contrib.auth.models import Group

from runs.models import RunStatus
from runs.services import workflow_create
from tests.helpers import drive, make_run, make_workflow

from .conftest import Api, assert_error, make_user, token_for

pytestmark = pytest.mark.django_db


def waiting(steps, *, workflow=None, input=None):
    run = make_run(steps=steps, workflow=workflow, input=input)
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def approval(step_id="review", **fields):
    return {"id": step_id, "kind": "approval", "prompt": f"{step_id}?", **fields}


def test_every_open_decision_is_listed_with_what_deciding_it_needs(viewer):
    plain = waiting([approval()])
    typed = waiting(
        [approval("ask", form={"type": "object", "properties": {"n": {"type": "integer"}}}, choices=["a", "b"])]
    )

    body = viewer.get("/decisions").json()

    by_run = {item["run_id"]: item for item in body["items"]}
    assert {str(plain.id), str(typed.id)} <= set(by_run)
    item = by_run[str(typed.id)]
    assert item["kind"] == "approval" and item["step_id"] == "ask" and item["attempt"] == 1
    assert item["form"]["properties"] == {"n": {"type": "integer"}} and item["choices"] == ["a", "b"]
    assert item["decide"] == f"/api/v1/runs/{typed.id}/approvals/ask"
    assert body["count"] == len(body["items"])


def test_a_childs_approval_is_in_the_inbox_as_the_childs(viewer):
    child = make_workflow(steps=[approval("inner")])
    parent = waiting([{"id": "sub", "kind": "child_run", "workflow": child.name, "input": {}}])

    items = viewer.get("/decisions").json()["items"]

    (found,) = [item for item in items if item["parent_run_id"] == str(parent.id)]
    assert found["step_id"] == "inner" and found["kind"] == "approval"
    assert all(item["run_id"] != str(parent.id) for item in items)  # the parent waits on its child, not a decision


def test_assignee_me_lists_what_is_assigned_to_my_name_or_my_groups():
    alice = make_user("alice", "runs.view_run")
    alice.groups.add(Group.objects.create(name="billing"))
    to_group = waiting([approval(assign={"group": "billing"})])
    to_alice = waiting([approval(assign={"user": "{{ input.who }}"})], input={"who": "alice"})
    to_bob = waiting([approval(assign={"user": "bob"})])
    waiting([approval()])

    mine = Api(token_for(alice)).get("/decisions", {"assignee": "me"}).json()["items"]
    bobs = Api(token_for(alice)).get("/decisions", {"assignee": "bob"}).json()["items"]

    assert {item["run_id"] for item in mine} == {str(to_group.id), str(to_alice.id)}
    assert [item["run_id"] for item in bobs] == [str(to_bob.id)]
    assert {item["assign"]["group"] for item in mine if "group" in item["assign"]} == {"billing"}


def test_filtered_by_workflow_and_kind_and_ordered_newest_first(viewer):
    workflow = workflow_create(definition={"name": "inbox-wf", "steps": [approval()]})
    first = waiting(None, workflow=workflow)
    second = waiting(None, workflow=workflow)
    waiting([approval()])

    oldest = viewer.get("/decisions", {"workflow": "inbox-wf"}).json()["items"]
    newest = viewer.get("/decisions", {"workflow": "inbox-wf", "order": "newest"}).json()["items"]
    budgets = viewer.get("/decisions", {"kind": "budget"}).json()["items"]

    assert [item["run_id"] for item in oldest] == [str(first.id), str(second.id)]
    assert [item["run_id"] for item in newest] == [str(second.id), str(first.id)]
    assert budgets == []


def test_older_than_leaves_out_what_opened_since(viewer):
    waiting([approval()])

    assert viewer.get("/decisions", {"older_than": 3600}).json()["items"] == []
    assert len(viewer.get("/decisions", {"older_than": 0}).json()["items"]) == 1


def test_filtered_by_an_attribute_of_the_run(viewer):
    workflow = workflow_create(
        definition={"name": "inbox-attr", "steps": [approval()], "attributes": {"customer": "{{ input.customer }}"}}
    )
    acme = waiting(None, workflow=workflow, input={"customer": "acme"})
    waiting(None, workflow=workflow, input={"customer": "globex"})

    found = viewer.get("/decisions", {"attr.customer": "acme"}).json()["items"]

    assert [item["run_id"] for item in found] == [str(acme.id)]
    assert viewer.get("/decisions", {"attr.customer": "initech"}).json()["items"] == []


@pytest.mark.parametrize(
    "query", [{"order": "sideways"}, {"kind": "poll"}, {"older_than": -1}, {"limit": 0}, {"attr.Bad Name": "x"}]
)
def test_a_bad_filter_is_422(viewer, query):
    assert_error(viewer.get("/decisions", query), 422)


def test_the_inbox_needs_a_viewer(nobody, anonymous):
    assert_error(nobody.get("/decisions"), 403)
    assert_error(anonymous.get("/decisions"), 401)

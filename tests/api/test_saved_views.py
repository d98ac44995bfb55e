"""Saved views (CONTRACT section 12): POST /views, GET /views with live counts, GET /views/{id}/runs paged as GET
/runs; shared with a Django group; the filter checked as GET /runs's; a bulk action's target (the same count)."""

import pytest
from django.contrib.auth.models import Group

from runs import selectors, services
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, tool_step

from .conftest import Api, assert_error, make_user, token_for

ATTRIBUTES = {"customer": "{{ input.customer }}", "tier": "{{ steps.classify.output.tier }}"}


@pytest.fixture
def workflow(db):
    steps = [echo_step("classify", tier="{{ input.plan }}")]
    return workflow_create(definition={"name": "viewed", "steps": steps, "attributes": ATTRIBUTES})


@pytest.fixture
def support(db):
    return Group.objects.create(name="support")


def member(username: str, group: Group, *perms: str) -> Api:
    user = make_user(username, *perms)
    user.groups.add(group)
    return Api(token_for(user))


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def test_saving_a_view_answers_it_with_its_live_count(operator, workflow):
    acme = [make_run(workflow=workflow, input={"customer": "acme"}) for _ in range(3)]
    make_run(workflow=workflow, input={"customer": "globex"})
    response = operator.post("/views", {"name": "acme's runs", "filter": {"attr.customer": "acme"}})
    assert response.status_code == 201, response.content
    view = response.json()
    assert view["name"] == "acme's runs" and view["owner"] == "otto" and view["group"] is None
    assert view["filter"] == {"attr.customer": "acme"}
    assert (view["count"], view["truncated"]) == (3, False)
    make_run(workflow=workflow, input={"customer": "acme"})
    assert operator.get(f"/views/{view['id']}").json()["count"] == len(acme) + 1


def test_a_views_runs_are_get_runs_with_its_filter_paged_the_same_way(operator, workflow):
    runs = [make_run(workflow=workflow, input={"customer": "acme", "plan": "gold"}) for _ in range(5)]
    make_run(workflow=workflow, input={"customer": "acme", "plan": "free"})
    for run in runs[:4]:
        drive_to_end(run)
    view = operator.post("/views", {"name": "gold", "filter": {"attr.tier": "gold", "status": "succeeded"}}).json()
    seen, cursor = [], None
    while True:
        page = operator.get(f"/views/{view['id']}/runs", {"limit": 2, **({"cursor": cursor} if cursor else {})})
        seen += _ids(page)
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(run.id) for run in reversed(runs[:4])]
    assert seen == _ids(operator.get("/runs", {"attr.tier": "gold", "status": "succeeded"}))
    assert page.json()["items"][0].keys() == operator.get("/runs").json()["items"][0].keys()


def test_a_view_keeps_every_filter_of_get_runs(operator, workflow):
    body = {
        "status": "failed",
        "workflow": "viewed",
        "stuck": True,
        "q": "acme",
        "input": {"customer": "acme"},
        "created_after": "2026-01-01T00:00:00",
        "created_before": "2027-01-01",
        "error_code": "timeout",
        "attr.customer": "acme",
        "attr.seats": 5,
    }
    view = operator.post("/views", {"name": "everything", "filter": body}).json()
    assert view["filter"] == {
        **body,
        "stuck": "true",
        "input": '{"customer": "acme"}',
        "attr.seats": "5",
    }
    assert view["count"] == 0


@pytest.mark.parametrize(
    ("filter", "field"),
    [
        ({"status": "lost"}, "filter.status"),
        ({"workflow": "Not A Name"}, "filter.workflow"),
        ({"parent": "not-a-run"}, "filter.parent"),
        ({"stuck": "perhaps"}, "filter.stuck"),
        ({"input": "[1, 2]"}, "filter.input"),
        ({"created_after": "yesterday"}, "filter.created_after"),
        ({"attr.Customer": "acme"}, "filter.attr.Customer"),
        ({"attr.customer": {"a": 1}}, "filter.attr.customer"),
        ({"colour": "red"}, "filter.colour"),
        ({"view": 1}, "filter.view"),
        ({"status": 3}, "filter.status"),
    ],
)
def test_a_bad_filter_is_422_naming_its_field(operator, db, filter, field):
    body = assert_error(operator.post("/views", {"name": "bad", "filter": filter}), 422, "invalid_filter")
    assert body["detail"].startswith(f"{field}:"), body


def test_a_blank_name_a_taken_name_and_a_foreign_group_are_refused(operator, db, support):
    assert_error(operator.post("/views", {"name": "  ", "filter": {}}), 422, "invalid_view")
    assert operator.post("/views", {"name": "mine", "filter": {}}).status_code == 201
    assert_error(operator.post("/views", {"name": "mine", "filter": {"status": "failed"}}), 409, "view_exists")
    body = assert_error(operator.post("/views", {"name": "theirs", "filter": {}, "group": "support"}), 422)
    assert body["detail"].startswith("group:"), body
    body = assert_error(operator.post("/views", {"name": "nobody's", "filter": {}, "group": "no-such"}), 422)
    assert body["detail"].startswith("group:"), body


def test_saving_a_view_needs_an_operator_reading_them_a_viewer(viewer, nobody, anonymous, db):
    assert_error(viewer.post("/views", {"name": "x", "filter": {"status": "lost"}}), 403, "forbidden")
    assert_error(nobody.get("/views"), 403, "forbidden")
    assert_error(anonymous.get("/views/1/runs"), 401)
    assert viewer.get("/views").json() == {"items": []}


def test_a_view_shared_with_a_group_is_seen_by_its_members_only(workflow, support):
    make_run(workflow=workflow, input={"customer": "acme"})
    owner = member("olga", support, "runs.view_run", "runs.operate")
    colleague = member("carl", support, "runs.view_run")
    outsider = Api(token_for(make_user("oscar", "runs.view_run")))
    shared = owner.post("/views", {"name": "acme", "filter": {"attr.customer": "acme"}, "group": "support"}).json()
    private = owner.post("/views", {"name": "mine", "filter": {}}).json()
    assert shared["group"] == "support"
    assert [(v["name"], v["count"]) for v in colleague.get("/views").json()["items"]] == [("acme", 1)]
    assert len(_ids(colleague.get(f"/views/{shared['id']}/runs"))) == 1
    assert outsider.get("/views").json() == {"items": []}
    assert_error(outsider.get(f"/views/{shared['id']}/runs"), 404, "view_not_found")
    assert_error(colleague.get(f"/views/{private['id']}"), 404, "view_not_found")
    assert [v["name"] for v in owner.get("/views").json()["items"]] == ["acme", "mine"]


def test_only_its_owner_deletes_a_view(workflow, support):
    owner = member("olga", support, "runs.view_run", "runs.operate")
    colleague = member("carl", support, "runs.view_run", "runs.operate")
    view = owner.post("/views", {"name": "acme", "filter": {}, "group": "support"}).json()
    assert_error(colleague.delete(f"/views/{view['id']}"), 403, "not_view_owner")
    assert owner.delete(f"/views/{view['id']}").status_code == 204
    assert_error(owner.get(f"/views/{view['id']}"), 404, "view_not_found")


def test_a_view_as_a_bulk_actions_target_previews_the_views_count(operator, workflow):
    failing = workflow_create(
        definition={
            "name": "viewed",
            "steps": [echo_step("classify", tier="{{ input.plan }}"), tool_step("charge", "test_fail")],
            "attributes": ATTRIBUTES,
        }
    )
    for customer in ("acme", "acme", "acme", "globex"):
        drive_to_end(make_run(workflow=failing, input={"customer": customer, "plan": "gold"}))
    make_run(workflow=workflow, input={"customer": "acme"})  # queued: not failed, not in the view
    view = operator.post("/views", {"name": "acme failed", "filter": {"attr.customer": "acme", "status": "failed"}})
    view = view.json()
    preview = services.bulk_preview(action="retry", filters={"view": view["id"]})
    assert preview["count"] == view["count"] == 3
    assert preview["view"] == {"id": view["id"], "name": "acme failed", "count": 3, "truncated": False}
    assert set(preview["sample"]) == set(_ids(operator.get(f"/views/{view['id']}/runs")))
    bulk = services.bulk_start(action="retry", filters={"view": view["id"]}, reason="card fixed", by="otto")
    assert bulk.total == 3 and bulk.filters == {"view": view["id"]}


def test_runs_of_filter_ands_a_view_with_more_filters(operator, workflow):
    gold = make_run(workflow=workflow, input={"customer": "acme", "plan": "gold"})
    drive_to_end(gold)
    make_run(workflow=workflow, input={"customer": "acme", "plan": "free"})
    view = operator.post("/views", {"name": "acme", "filter": {"attr.customer": "acme"}}).json()
    assert selectors.runs_of_filter({"view": view["id"]}).count() == 2
    assert list(selectors.runs_of_filter({"view": view["id"], "attr.tier": "gold"})) == [gold]
    assert not selectors.runs_of_filter({"view": view["id"], "attr.customer": "globex"}).exists()
    assert_error(operator.get("/views/999999/runs"), 404, "view_not_found")

"""The runs page's attributes and saved views (issue 27 section 4): filter by attr.NAME, the one search box, sort
the page by an attribute, save the filter as a view (shared with a group), open it with its count, and use it as
a bulk action's target; the run page shows a run's attributes. Refusals are messages; forms need an operator."""

import json
import re

import pytest
from django.contrib.auth.models import Group, User

from runs.models import BulkAction, SavedView
from runs.services import view_create, workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, tool_step

from .conftest import htmx, logged_in, make_user

pytestmark = pytest.mark.django_db

ATTRIBUTES = {
    "customer": "{{ input.customer }}",
    "seats": "{{ input.seats }}",
    "tier": "{{ steps.classify.output.tier }}",
}


@pytest.fixture
def workflow():
    steps = [echo_step("classify", tier="{{ input.plan }}")]
    return workflow_create(definition={"name": "paged", "steps": steps, "attributes": ATTRIBUTES})


def rows(page: str) -> list[str]:
    return re.findall(r'<tr class="run-row" data-status="\w+" data-run="([0-9a-f-]+)"', page)


def test_the_runs_page_filters_by_attributes_and_shows_them(viewer, workflow):
    acme = make_run(workflow=workflow, input={"customer": "acme", "plan": "gold"})
    drive_to_end(acme)
    make_run(workflow=workflow, input={"customer": "globex"})
    page = viewer.get("/runs/", {"attr.customer": "acme"}).content.decode()
    assert rows(page) == [str(acme.id)]
    assert 'id="attribute-filters"' in page and "customer = acme" in page
    assert "?attr.tier=gold" in page  # its chips link to the runs with the same value
    # The form's name and value boxes make the same filter; the kept ones come along as hidden fields.
    page = viewer.get("/runs/", {"attr.customer": "acme", "attr_name": "tier", "attr_value": "gold"}).content.decode()
    assert rows(page) == [str(acme.id)]
    assert rows(viewer.get("/runs/", {"attr_name": "tier", "attr_value": "free"}).content.decode()) == []


def test_a_bad_attribute_filter_is_dropped_with_a_message(viewer, workflow):
    make_run(workflow=workflow, input={"customer": "acme"})
    page = viewer.get("/runs/", {"attr.Bad": "x"}).content.decode()
    assert "attr.Bad: an attribute&#x27;s name is 1-40 characters" in page
    assert len(rows(page)) == 1


def test_the_search_box_takes_an_attribute_value_a_key_or_an_id(operator, workflow):
    acme = make_run(workflow=workflow, input={"customer": "acme-corp"})
    other = make_run(workflow=workflow, input={"customer": "globex"})
    assert rows(operator.get("/runs/", {"q": "acme-corp"}).content.decode()) == [str(acme.id)]
    assert rows(operator.get("/runs/", {"q": f"{other.id}:classify:1"}).content.decode()) == [str(other.id)]
    assert rows(operator.get("/runs/", {"q": str(other.id)[:8]}).content.decode()) == [str(other.id)]


def test_the_page_sorts_by_an_attribute(viewer, workflow):
    seats = [12, 3, 40]
    runs = [make_run(workflow=workflow, input={"customer": "c", "seats": n}) for n in seats]
    make_run(workflow=workflow, input={"customer": "no seats"})
    page = viewer.get("/runs/", {"sort": "seats"}).content.decode()
    assert rows(page)[:3] == [str(runs[1].id), str(runs[0].id), str(runs[2].id)]  # 3, 12, 40; without it last
    page = viewer.get("/runs/", {"sort": "-seats"}).content.decode()
    assert rows(page)[:3] == [str(runs[2].id), str(runs[0].id), str(runs[1].id)]


def test_an_operator_saves_the_filter_as_a_view_and_opens_it(operator, workflow):
    acme = make_run(workflow=workflow, input={"customer": "acme"})
    make_run(workflow=workflow, input={"customer": "globex"})
    page = operator.get("/runs/", {"attr.customer": "acme", "status": "queued"}).content.decode()
    assert 'id="save-view"' in page and 'name="attr.customer" value="acme"' in page
    response = operator.post("/runs/views/", {"name": "acme queued", "attr.customer": "acme", "status": "queued"})
    view = SavedView.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/?view={view.id}"
    assert view.filter == {"attr.customer": "acme", "status": "queued"} and view.owner.username == "otto"
    page = operator.get(f"/runs/?view={view.id}").content.decode()
    assert rows(page) == [str(acme.id)]
    assert '<span id="view-title">acme queued</span>' in page and "Saved view by otto" in page
    assert 'hx-trigger="load"' in page and 'class="muted count"' not in page  # counted in a request of its own
    counts = operator.get(f"/runs/?view={view.id}", headers=htmx("saved-view-list")).content.decode()
    assert re.search(r'aria-current="page">acme queued</a> <span class="muted count"[^>]*>1</span>', counts)
    assert "hx-trigger" not in counts


def test_a_refused_view_is_a_message_and_a_viewer_may_not_save(operator, viewer, workflow):
    operator.post("/runs/views/", {"name": "", "status": "failed"})
    assert not SavedView.objects.exists()
    page = operator.get("/runs/", {"status": "failed"}).content.decode()
    assert "View not saved: name: 1-100 characters" in page
    assert viewer.post("/runs/views/", {"name": "mine", "status": "failed"}).status_code == 403
    assert 'id="save-view"' not in viewer.get("/runs/", {"status": "failed"}).content.decode()


def test_a_view_shared_with_a_group_is_listed_for_its_members(workflow):
    support = Group.objects.create(name="support")
    owner, colleague = make_user("olga", "runs.view_run", "runs.operate"), make_user("carl", "runs.view_run")
    outsider = make_user("oscar", "runs.view_run")
    owner.groups.add(support)
    colleague.groups.add(support)
    make_run(workflow=workflow, input={"customer": "acme"})
    view = view_create(name="acme", filter={"attr.customer": "acme"}, owner=owner, group="support")
    page = logged_in(colleague).get("/runs/").content.decode()
    assert f'href="?view={view.id}"' in page and "· support" in page
    assert f'href="?view={view.id}"' not in logged_in(outsider).get("/runs/").content.decode()
    page = logged_in(outsider).get(f"/runs/?view={view.id}").content.decode()
    assert "does not exist (or is not shared with you)" in page
    assert 'name="group"' in logged_in(owner).get("/runs/", {"status": "queued"}).content.decode()


def test_a_views_bulk_preview_counts_the_views_runs(operator, workflow):
    failing = workflow_create(
        definition={
            "name": "paged",
            "steps": [echo_step("classify"), tool_step("charge", "test_fail")],
            "attributes": ATTRIBUTES,
        }
    )
    for customer in ("acme", "acme", "globex"):
        drive_to_end(make_run(workflow=failing, input={"customer": customer}))
    otto = User.objects.get(username="otto")
    view = view_create(name="acme failed", filter={"attr.customer": "acme", "status": "failed"}, owner=otto)
    page = operator.get(f"/runs/?view={view.id}").content.decode()
    assert f'name="view" value="{view.id}"' in page  # the bulk form's target is the view
    response = operator.post(
        "/runs/bulk/",
        {"action": "retry", "scope": "matching", "view": str(view.id), "reason": "card fixed", "step": "preview"},
    )
    preview = response.context["preview"]
    assert preview["count"] == preview["view"]["count"] == 2
    assert "The saved view <strong>acme failed</strong> holds 2 runs." in response.content.decode()
    previewed = json.loads(response.context["filters_json"])
    operator.post(
        "/runs/bulk/", {"action": "retry", "previewed": json.dumps(previewed), "step": "start", "reason": "card fixed"}
    )
    bulk = BulkAction.objects.get()
    assert bulk.total == 2 and bulk.filters["view"] == str(view.id)


def test_the_run_page_shows_the_runs_attributes(viewer, workflow):
    run = make_run(workflow=workflow, input={"customer": "acme", "seats": 4, "plan": "gold"})
    drive_to_end(run)
    page = viewer.get(f"/runs/{run.id}/").content.decode()
    attributes = page[page.index('id="run-attributes"') :]
    assert "customer</span> acme" in attributes and "seats</span> 4" in attributes and "tier</span> gold" in attributes

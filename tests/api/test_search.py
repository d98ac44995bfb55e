"""GET /runs's search filters (CONTRACT section 6): input containment, created_after / created_before, error_code;
the same filters on the runs page and in a bulk action's set (runs.selectors.runs_matching is the one definition)."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client

from runs import search, services
from runs.models import Run
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, tool_step

from .conftest import assert_error, make_user


@pytest.fixture
def workflow(db):
    return make_workflow(name="search", steps=[echo_step("only", said="hi")])


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def _at(run: Run, when: datetime) -> None:
    Run.objects.filter(id=run.id).update(created_at=when)


# --- input ----------------------------------------------------------------------------------------


def test_the_input_filter_lists_the_runs_whose_input_contains_the_object_newest_first(viewer, workflow):
    acme_gold = make_run(workflow=workflow, input={"customer": "acme", "tier": {"name": "gold", "seats": 5}})
    make_run(workflow=workflow, input={"customer": "globex", "tier": {"name": "gold"}})
    acme_tagged = make_run(workflow=workflow, input={"customer": "acme", "tags": ["urgent", "vip"], "n": 1})
    assert _ids(viewer.get("/runs", {"input": '{"customer": "acme"}'})) == [str(acme_tagged.id), str(acme_gold.id)]
    assert _ids(viewer.get("/runs", {"input": '{"tier": {"name": "gold", "seats": 5}}'})) == [str(acme_gold.id)]
    assert _ids(viewer.get("/runs", {"input": '{"tags": ["vip"]}'})) == [str(acme_tagged.id)]
    assert _ids(viewer.get("/runs", {"input": '{"n": 1.0}'})) == [str(acme_tagged.id)]
    assert _ids(viewer.get("/runs", {"input": '{"customer": "ACME"}'})) == []
    assert _ids(viewer.get("/runs", {"input": '{"n": true}'})) == []


def test_the_input_filter_combines_with_status_and_walks_its_pages_with_the_cursor(viewer, workflow):
    matching = [make_run(workflow=workflow, input={"batch": 7, "i": i}) for i in range(5)]
    for other in range(3):
        make_run(workflow=workflow, input={"batch": 8, "i": other})
    done = matching[0]
    drive_to_end(done)
    seen, cursor = [], None
    while True:
        page = viewer.get("/runs", {"input": '{"batch": 7}', "limit": 2, **({"cursor": cursor} if cursor else {})})
        seen += _ids(page)
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(r.id) for r in reversed(matching)]
    assert _ids(viewer.get("/runs", {"input": '{"batch": 7}', "status": "succeeded"})) == [str(done.id)]


# Each pair as Postgres answers `value @> probe` (checked against the server below when the tests run on it).
CONTAINMENT = [
    ({"a": 1, "b": 2}, {"a": 1}, True),
    ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}, True),
    ({"a": {"b": 1}}, {"a": {"b": 2}}, False),
    ({"a": [1, 2, 3]}, {"a": [3, 1]}, True),
    ({"a": [1, 2]}, {"a": [1, 1]}, True),
    ({"a": [1, 2]}, {"a": []}, True),
    ({"a": ["x"]}, {"a": "x"}, False),  # an array contains a bare scalar at the top level only
    (["foo", "bar"], "foo", True),
    ({"a": [{"b": 1, "c": 2}]}, {"a": [{"b": 1}]}, True),
    ({"a": [1, [2, 3]]}, {"a": [[2]]}, True),
    ({"a": [1, [2, 3]]}, {"a": [2]}, False),
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": True}, {"a": 1}, False),
    ({"a": None}, {"a": None}, True),
    ({}, {"a": None}, False),
    ({"a": {}}, {"a": []}, False),
    ({"a": "1"}, {"a": 1}, False),
]


@pytest.mark.parametrize("value,probe,contains", CONTAINMENT)
def test_sqlites_containment_is_postgres_containment(db, value, probe, contains):
    assert search.json_contains(value, probe) is contains
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb @> %s::jsonb", [json.dumps(value), json.dumps(probe)])
            assert cursor.fetchone()[0] is contains


def test_text_postgres_cannot_store_is_found_as_it_was_sent(viewer, workflow):
    run = make_run(workflow=workflow, input={"note": "nul \u0000 here"})
    make_run(workflow=workflow, input={"note": "nul here"})
    assert _ids(viewer.get("/runs", {"input": json.dumps({"note": "nul \u0000 here"})})) == [str(run.id)]


# --- dates and error codes --------------------------------------------------------------------------


def test_created_after_is_inclusive_and_created_before_exclusive(viewer, workflow):
    noon = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    early, at_noon, late = (make_run(workflow=workflow) for _ in range(3))
    _at(early, noon - timedelta(hours=1))
    _at(at_noon, noon)
    _at(late, noon + timedelta(hours=1))
    assert _ids(viewer.get("/runs", {"created_after": "2026-11-30T12:00:00Z"})) == [str(late.id), str(at_noon.id)]
    assert _ids(viewer.get("/runs", {"created_before": "2026-11-30T12:00:00+00:00"})) == [str(early.id)]
    window = {"created_after": "2026-11-30T11:30:00", "created_before": "2026-11-30T13:00:00Z"}  # no zone: UTC
    assert _ids(viewer.get("/runs", window)) == [str(at_noon.id)]
    assert _ids(viewer.get("/runs", {"created_after": "2026-11-30T13:30:00+02:00"})) == [str(late.id), str(at_noon.id)]
    assert _ids(viewer.get("/runs", {"created_before": "2026-11-30"})) == []


def test_the_error_code_filter_lists_the_runs_that_failed_with_that_code(viewer, db):
    refused = make_run(steps=[tool_step("go", "test_fail")])
    drive_to_end(refused)
    buggy = make_run(steps=[tool_step("go", "test_boom")])
    drive_to_end(buggy)
    drive_to_end(make_run(steps=[echo_step("fine")]))
    assert refused.error["code"] == "test_refused" and buggy.error["code"] == "internal_error"
    assert _ids(viewer.get("/runs", {"error_code": "test_refused"})) == [str(refused.id)]
    assert _ids(viewer.get("/runs", {"error_code": "internal_error", "status": "failed"})) == [str(buggy.id)]
    assert _ids(viewer.get("/runs", {"error_code": "nobody_has_this"})) == []


@pytest.mark.parametrize(
    "params,field",
    [
        ({"input": "customer=acme"}, "input"),
        ({"input": "[1, 2]"}, "input"),
        ({"input": '"acme"'}, "input"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_before": "2026-13-01T00:00:00Z"}, "created_before"),
        ({"error_code": "x" * 101}, "error_code"),
    ],
)
def test_a_bad_search_filter_is_422_naming_it(viewer, params, field):
    body = assert_error(viewer.get("/runs", params), 422, "invalid_filter")
    assert body["detail"].startswith(f"{field}: "), body


# --- the same filters on the runs page and in bulk actions ---------------------------------------------


def _page(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_runs_page_filters_by_input_dates_and_error_code_and_names_a_bad_filter(db, workflow):
    page = _page(make_user("pia", "runs.view_run"))
    acme = make_run(workflow=workflow, input={"customer": "acme"})
    globex = make_run(workflow=workflow, input={"customer": "globex"})
    _at(globex, datetime(2026, 1, 1, tzinfo=UTC))
    body = page.get("/runs/", {"input": '{"customer":"acme"}'}).content.decode()
    assert f'data-run="{acme.id}"' in body and f'data-run="{globex.id}"' not in body
    assert 'value="{&quot;customer&quot;: &quot;acme&quot;}"' in body  # the form keeps the filter
    body = page.get("/runs/", {"created_before": "2026-02-01T00:00"}).content.decode()
    assert f'data-run="{globex.id}"' in body and f'data-run="{acme.id}"' not in body
    assert 'value="2026-02-01T00:00:00"' in body
    response = page.get("/runs/", {"created_after": "soon", "input": "[]"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "created_after: &#x27;soon&#x27; is not an ISO 8601 date-time" in body
    assert "input: must be a JSON object" in body
    assert f'data-run="{acme.id}"' in body and f'data-run="{globex.id}"' in body  # a bad filter is dropped


def test_a_bulk_action_over_the_matching_runs_takes_only_those_the_search_filters_match(db, workflow):
    acme = [make_run(workflow=workflow, input={"customer": "acme"}) for _ in range(2)]
    make_run(workflow=workflow, input={"customer": "globex"})
    preview = services.bulk_preview(action="cancel", filters={"input": '{"customer": "acme"}'})
    assert preview["count"] == 2 and set(preview["sample"]) == {str(r.id) for r in acme}
    with pytest.raises(search.InvalidFilter, match=r"^created_after: "):
        services.bulk_preview(action="cancel", filters={"created_after": "later"})
    page = _page(make_user("olga", "runs.view_run", "runs.operate"))
    response = page.post(
        "/runs/bulk/",
        {"action": "cancel", "scope": "matching", "input": '{"customer": "acme"}', "step": "preview", "reason": "x"},
    )
    assert response.status_code == 200, response.content
    assert all(str(r.id)[:8] in response.content.decode() for r in acme)

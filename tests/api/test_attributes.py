"""A workflow's attributes (CONTRACT section 12): checked when the workflow is posted, set when the run is created
(input templates) or when the step they read ends, and GET /runs's attr.NAME=VALUE filters and search box (q)."""

import pytest

from runs.models import RunAttribute
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow

from .conftest import assert_error

ATTRIBUTES = {
    "customer": "{{ input.customer }}",
    "seats": "{{ input.seats }}",
    "tier": "{{ steps.classify.output.tier }}",
}


@pytest.fixture
def workflow(db):
    steps = [echo_step("classify", tier="{{ input.plan }}"), echo_step("reply", said="hi")]
    return make_workflow(name="attributed", steps=steps)


def attributed(**more):
    steps = [echo_step("classify", tier="{{ input.plan }}"), echo_step("reply", said="hi")]
    return workflow_create(definition={"name": "attributed", "steps": steps, "attributes": ATTRIBUTES, **more})


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def _attributes(run) -> dict:
    return {row.name: row.value for row in RunAttribute.objects.filter(run_id=run.id)}


# --- the workflow field ---------------------------------------------------------------------------


def test_posting_a_workflow_with_attributes_keeps_them(operator):
    steps = [echo_step("classify", tier="gold")]
    response = operator.post("/workflows", {"name": "with-attrs", "steps": steps, "attributes": ATTRIBUTES})
    assert response.status_code == 201, response.content
    assert response.json()["definition"]["attributes"] == ATTRIBUTES


@pytest.mark.parametrize(
    ("attributes", "loc", "words"),
    [
        ({"Customer": "{{ input.customer }}"}, "attributes.Customer", "a-z 0-9 _"),
        ({"customer": "acme"}, "attributes.customer", "template"),
        ({"customer": 3}, "attributes.customer", "template"),
        ({"tier": "{{ steps.nowhere.output.tier }}"}, "attributes.tier", "unknown step 'nowhere'"),
        ({"tier": "{{ steps.classify.tier }}"}, "attributes.tier", "steps.ID.output"),
        ({"n": "{{ item }}"}, "attributes.n", "for_each"),
        ([], "attributes", "an object"),
    ],
)
def test_a_bad_attribute_is_refused_with_422_naming_it(operator, attributes, loc, words):
    steps = [echo_step("classify", tier="gold")]
    response = operator.post("/workflows", {"name": "bad-attrs", "steps": steps, "attributes": attributes})
    body = assert_error(response, 422, "invalid_workflow")
    assert [e["loc"] for e in body["errors"]] == [loc], body
    assert words in body["errors"][0]["msg"], body


# --- when they are set ----------------------------------------------------------------------------


def test_a_run_has_its_input_attributes_from_its_creation_with_their_json_types(db):
    run = make_run(workflow=attributed(), input={"customer": "acme", "seats": 5, "plan": "gold"})
    assert _attributes(run) == {"customer": "acme", "seats": 5}
    texts = dict(RunAttribute.objects.filter(run_id=run.id).values_list("name", "text"))
    assert texts == {"customer": "acme", "seats": "5"}


def test_a_step_attribute_is_set_when_its_step_ends(db):
    run = make_run(workflow=attributed(), input={"customer": "acme", "plan": "gold"})
    drive_to_end(run)
    assert _attributes(run) == {"customer": "acme", "tier": "gold"}  # seats: not in the input, left unset


def test_an_attribute_whose_field_is_missing_is_left_unset(db):
    steps = [echo_step("classify", said="no tier here")]  # classify's output has no tier
    workflow = workflow_create(definition={"name": "tierless", "steps": steps, "attributes": ATTRIBUTES})
    run = make_run(workflow=workflow, input={"customer": "acme"})
    drive_to_end(run)
    assert run.status == "succeeded"
    assert _attributes(run) == {"customer": "acme"}


# --- GET /runs?attr.NAME=VALUE ----------------------------------------------------------------------


def test_attribute_filters_are_anded_and_compare_the_values_text(viewer, db):
    workflow = attributed()
    acme_gold = make_run(workflow=workflow, input={"customer": "acme", "plan": "gold", "seats": 5})
    acme_free = make_run(workflow=workflow, input={"customer": "acme", "plan": "free", "seats": 2})
    globex_gold = make_run(workflow=workflow, input={"customer": "globex", "plan": "gold", "seats": 5})
    for run in (acme_gold, acme_free, globex_gold):
        drive_to_end(run)
    assert _ids(viewer.get("/runs", {"attr.customer": "acme"})) == [str(acme_free.id), str(acme_gold.id)]
    assert _ids(viewer.get("/runs", {"attr.customer": "acme", "attr.tier": "gold"})) == [str(acme_gold.id)]
    assert _ids(viewer.get("/runs", {"attr.seats": "5"})) == [str(globex_gold.id), str(acme_gold.id)]
    assert _ids(viewer.get("/runs", {"attr.tier": "gold", "status": "failed"})) == []
    assert _ids(viewer.get("/runs", {"attr.tier": "gold", "input": '{"customer": "globex"}'})) == [str(globex_gold.id)]
    assert _ids(viewer.get("/runs", {"attr.customer": "ACME"})) == []


def test_an_attribute_filter_walks_its_pages_with_the_cursor(viewer, db):
    workflow = attributed()
    matching = [make_run(workflow=workflow, input={"customer": "acme", "i": i}) for i in range(5)]
    for i in range(3):
        make_run(workflow=workflow, input={"customer": "globex", "i": i})
    seen, cursor = [], None
    while True:
        page = viewer.get("/runs", {"attr.customer": "acme", "limit": 2, **({"cursor": cursor} if cursor else {})})
        seen += _ids(page)
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(run.id) for run in reversed(matching)]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"attr.Customer": "acme"}, "attr.Customer"),
        ({"attr.": "acme"}, "attr."),
        ({"attr.customer": "x" * 201}, "attr.customer"),
    ],
)
def test_a_bad_attribute_filter_is_422_naming_it(viewer, db, params, field):
    body = assert_error(viewer.get("/runs", params), 422, "invalid_filter")
    assert body["detail"].startswith(f"{field}:"), body


def test_the_attribute_filter_needs_a_viewer(nobody, anonymous, db):
    assert_error(nobody.get("/runs", {"attr.Bad name": "x"}), 403)
    assert_error(anonymous.get("/runs", {"attr.customer": "acme"}), 401)


# --- q: one search box ------------------------------------------------------------------------------


def test_q_finds_a_run_by_its_id_its_start_or_a_steps_key(viewer, workflow):
    run, other = make_run(workflow=workflow), make_run(workflow=workflow)
    assert _ids(viewer.get("/runs", {"q": str(run.id)})) == [str(run.id)]
    assert str(run.id) in _ids(viewer.get("/runs", {"q": str(run.id)[:8]}))
    assert str(other.id) not in _ids(viewer.get("/runs", {"q": str(run.id)[:13]}))
    assert _ids(viewer.get("/runs", {"q": f"{run.id}:classify:1"})) == [str(run.id)]
    assert _ids(viewer.get("/runs", {"q": f"{run.id}:classify[3]:2".upper()})) == [str(run.id)]


def test_q_finds_a_run_by_the_idempotency_key_its_user_sent(operator, viewer, workflow):
    created = operator.post(
        "/runs", {"workflow": workflow.name, "input": {}}, headers={"Idempotency-Key": "order-7731"}
    ).json()
    make_run(workflow=workflow)
    assert _ids(operator.get("/runs", {"q": "order-7731"})) == [created["id"]]
    assert _ids(viewer.get("/runs", {"q": "order-7731"})) == []  # keys are per user: not vera's


def test_q_finds_the_runs_with_an_attribute_of_that_value(viewer, db):
    workflow = attributed()
    acme = make_run(workflow=workflow, input={"customer": "acme-corp"})
    make_run(workflow=workflow, input={"customer": "globex"})
    assert _ids(viewer.get("/runs", {"q": "acme-corp"})) == [str(acme.id)]
    assert _ids(viewer.get("/runs", {"q": "  acme-corp "})) == [str(acme.id)]
    assert _ids(viewer.get("/runs", {"q": "acme"})) == []


def test_q_over_500_characters_is_422(viewer, db):
    assert_error(viewer.get("/runs", {"q": "x" * 501}), 422)


def test_q_finds_a_value_under_any_attribute_name_each_run_once(viewer, db):
    steps = [echo_step("only")]
    both = {"customer": "{{ input.customer }}", "account": "{{ input.account }}"}
    workflow = workflow_create(definition={"name": "two-names", "steps": steps, "attributes": both})
    customer = make_run(workflow=workflow, input={"customer": "acme"})
    account = make_run(workflow=workflow, input={"account": "acme"})
    twice = make_run(workflow=workflow, input={"customer": "acme", "account": "acme"})
    make_run(workflow=workflow, input={"customer": "globex"})
    expected = [str(twice.id), str(account.id), str(customer.id)]
    assert _ids(viewer.get("/runs", {"q": "acme"})) == expected
    assert _ids(viewer.get("/runs", {"q": "acme", "attr.customer": "acme"})) == [str(twice.id), str(customer.id)]


def test_q_as_one_attributes_value_pages_and_ands_with_its_filters(viewer, db):
    workflow = attributed()
    acme = [make_run(workflow=workflow, input={"customer": "acme", "seats": i}) for i in range(3)]
    make_run(workflow=workflow, input={"customer": "globex"})
    first = viewer.get("/runs", {"q": "acme", "limit": 2})
    second = viewer.get("/runs", {"q": "acme", "limit": 2, "cursor": first.json()["next_cursor"]})
    assert _ids(first) + _ids(second) == [str(run.id) for run in reversed(acme)]
    assert _ids(viewer.get("/runs", {"q": "acme", "attr.seats": "1"})) == [str(acme[1].id)]
    assert _ids(viewer.get("/runs", {"q": "acme", "attr.customer": "globex"})) == []


def test_q_that_is_a_run_id_and_an_attribute_value_finds_both(viewer, db):
    workflow = attributed()
    named = make_run(workflow=workflow, input={"customer": "x"})
    pointing = make_run(workflow=workflow, input={"customer": str(named.id)})
    assert _ids(viewer.get("/runs", {"q": str(named.id)})) == [str(pointing.id), str(named.id)]

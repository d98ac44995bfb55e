"""Numbers no JSON column stores (NaN, Infinity, 1e999) and whole numbers too long for Python's reader, in any
JSON body: 422 naming the field, and nothing written. Never a 500 (issue 23, section 7)."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, Schedule, Signal, Workflow
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow

from .conftest import assert_error

BAD = [
    pytest.param("NaN", "NaN is not a number JSON allows", id="nan"),
    pytest.param("-Infinity", "-Infinity is not a number JSON allows", id="minus-infinity"),
    pytest.param("1e999", "1e999 is too large for a number", id="1e999"),
    pytest.param("9" * 5000, "has more than 4300 digits", id="5000-digits"),
]


def with_number(body: dict, path: tuple, raw_number: str) -> str:
    """body as JSON text with raw_number (as the client wrote it) at path."""
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = "__NUMBER__"
    return json.dumps(body).replace('"__NUMBER__"', raw_number)


def refused(response, loc: str, msg: str) -> None:
    body = assert_error(response, 422, "validation_error")
    assert body["errors"] == [{"loc": loc, "msg": body["errors"][0]["msg"]}], body
    assert msg in body["errors"][0]["msg"] and loc in body["detail"], body


def counts() -> tuple:
    return (
        Run.objects.count(),
        JournalEvent.objects.count(),
        Signal.objects.count(),
        Workflow.objects.count(),
        Schedule.objects.count(),
    )


@pytest.fixture
def hello(db):
    return make_workflow(name="hello", steps=[echo_step("only")])


@pytest.mark.parametrize("number, msg", BAD)
def test_a_run_input_with_a_nonfinite_number_is_422_naming_the_field(operator, hello, number, msg):
    before = counts()
    raw = with_number({"workflow": "hello", "input": {"amount": 0}}, ("input", "amount"), number)
    refused(operator.post("/runs", raw=raw), "input.amount", msg)
    assert counts() == before


@pytest.mark.parametrize("number, msg", BAD)
def test_a_batch_with_a_nonfinite_number_is_422_naming_the_item(operator, hello, number, msg):
    before = counts()
    body = {"runs": [{"workflow": "hello", "input": {}}, {"workflow": "hello", "input": {"n": 0}}]}
    refused(
        operator.post("/runs/batch", raw=with_number(body, ("runs", 1, "input", "n"), number)), "runs[1].input.n", msg
    )
    assert counts() == before


@pytest.mark.parametrize("number, msg", BAD)
def test_a_workflow_with_a_nonfinite_number_is_422_naming_the_field(operator, db, number, msg):
    before = counts()
    definition = {"name": "nonfinite", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {"x": 0}}]}
    raw = with_number(definition, ("steps", 0, "args", "x"), number)
    refused(operator.post("/workflows", raw=raw), "steps[0].args.x", msg)
    assert counts() == before


@pytest.mark.parametrize("number, msg", BAD)
def test_a_schedule_with_a_nonfinite_number_is_422_naming_the_field(operator, hello, number, msg):
    before = counts()
    raw = with_number({"workflow": "hello", "cron": "0 * * * *", "input": {"x": 0}}, ("input", "x"), number)
    refused(operator.post("/schedules", raw=raw), "input.x", msg)
    assert counts() == before


@pytest.mark.parametrize("number, msg", BAD)
def test_a_custom_event_with_a_nonfinite_number_is_422_naming_the_field(operator, hello, number, msg):
    run = make_run(workflow=hello)
    before = counts()
    raw = with_number({"kind": "confidence_evaluated", "payload": {"score": 0}}, ("payload", "score"), number)
    refused(operator.post(f"/runs/{run.id}/events", raw=raw), "payload.score", msg)
    assert counts() == before


@pytest.mark.parametrize("number, msg", BAD)
def test_a_signal_with_a_nonfinite_number_is_422_naming_the_field(operator, db, number, msg):
    run = make_run(steps=[{"id": "go", "kind": "signal", "name": "go"}, echo_step("after")])
    drive_to_end(run)
    before = counts()
    raw = with_number({"payload": {"n": 0}}, ("payload", "n"), number)
    refused(operator.post(f"/runs/{run.id}/signals/go", raw=raw), "payload.n", msg)
    assert counts() == before


def test_a_whole_body_that_is_nan_is_422_naming_the_body(operator, hello):
    refused(operator.post("/runs", raw="NaN"), "body", "NaN is not a number JSON allows")


def test_numbers_that_only_look_alike_are_accepted_as_they_are(operator, hello):
    raw = '{"workflow": "hello", "input": {"a": "NaN", "b": 1e300, "c": 1e-999, "d": "Infinity and 1e999"}}'
    response = operator.post("/runs", raw=raw)
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {"a": "NaN", "b": 1e300, "c": 0.0, "d": "Infinity and 1e999"}


def test_an_input_filter_with_a_nonfinite_number_is_422_naming_it(viewer, hello):
    response = viewer.get("/runs", {"input": '{"amount": NaN}'})
    body = assert_error(response, 422, "invalid_filter")
    assert body["detail"].startswith("input.amount: NaN is not a number JSON allows"), body


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_a_date_filter_past_the_last_utc_moment_is_422_not_a_500(viewer, hello, moment):
    for name in ("created_after", "created_before"):
        body = assert_error(viewer.get("/runs", {name: moment}), 422, "invalid_filter")
        assert body["detail"].startswith(f"{name}: {moment!r} is outside the date-times"), body


def test_an_item_index_of_5000_digits_names_no_item_with_404(viewer, db):
    run = make_run(steps=[{"id": "read", "kind": "tool_call", "tool": "echo", "for_each": "{{ input.xs }}"}])
    for index in ("9" * 5000, "1234567890"):
        body = assert_error(viewer.get(f"/runs/{run.id}/steps/read[{index}]"), 404, "step_not_found")
        assert "read[" in body["detail"], body

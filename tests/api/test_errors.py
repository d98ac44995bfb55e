"""Every error is JSON {detail, code}; bad input is never a 500."""

import json

import pytest
from django.test import override_settings

from tests.helpers import echo_step, make_workflow

from .conftest import API, assert_error


@pytest.fixture
def workflow(db):
    return make_workflow(name="hello", steps=[echo_step("only")])


@pytest.mark.parametrize("raw", ["{bad", "{'single': 'quotes'}", '{"workflow": "hello",}', "\x00\xff", "nan"])
def test_malformed_json_is_400(operator, workflow, raw):
    assert_error(operator.post("/runs", raw=raw), 400, "malformed_json")


def test_a_form_body_is_400(operator, workflow):
    response = operator.post("/runs", raw="workflow=hello", content_type="application/x-www-form-urlencoded")
    assert_error(response, 400, "malformed_json")


@pytest.mark.parametrize("raw", ["[]", '"text"', "42", "null", "true"])
def test_a_body_that_is_not_an_object_is_422(operator, workflow, raw):
    assert_error(operator.post("/runs", raw=raw), 422, "validation_error")


def test_a_body_over_the_limit_is_413(operator, workflow):
    with override_settings(PAL_API_MAX_BODY_BYTES=200):
        small = operator.post("/runs", {"workflow": "hello", "input": {"text": "x" * 50}})
        big = operator.post("/runs", {"workflow": "hello", "input": {"text": "x" * 500}})
    assert small.status_code == 201
    body = assert_error(big, 413, "body_too_large")
    assert "200 bytes" in body["detail"]


def test_a_huge_workflow_is_413_not_parsed(operator):
    steps = [{"id": f"s{i}", "kind": "tool_call", "tool": "echo", "args": {"pad": "x" * 100}} for i in range(20_000)]
    assert_error(operator.post("/workflows", {"name": "huge", "steps": steps}), 413, "body_too_large")


def test_a_body_is_checked_before_the_token_is_not(anonymous):
    # Past the limit the body is refused before anything else reads it, whoever sends it.
    with override_settings(PAL_API_MAX_BODY_BYTES=10):
        assert_error(anonymous.post("/runs", {"workflow": "a-long-name"}), 413)


def test_a_bad_content_length_is_400(operator):
    response = operator.client.generic(
        "POST",
        f"{API}/runs",
        b"{}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {operator.token}"},
        CONTENT_LENGTH="lots",
    )
    assert_error(response, 400)


def test_an_unknown_address_is_a_json_404(viewer):
    assert_error(viewer.get("/no/such/thing"), 404, "not_found")


def test_a_wrong_method_is_a_json_405_with_allow(operator):
    response = operator.method("DELETE", "/workflows")
    assert_error(response, 405, "method_not_allowed")
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_pages_outside_the_api_keep_their_own_errors(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


def test_an_unexpected_error_is_a_json_500(operator, workflow, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr("runs.services.run_create", broken)
    operator.client.raise_request_exception = False
    body = assert_error(operator.post("/runs", {"workflow": "hello"}), 500, "internal_error")
    assert "bug" not in body["detail"]


@pytest.mark.parametrize("path", ["/runs/not-a-uuid", "/runs/1/events", "/runs/%00/receipt", "/runs/zzz/waterfall"])
def test_a_bad_run_id_is_422(viewer, path):
    body = assert_error(viewer.get(path), 422, "validation_error")
    assert body["errors"][0]["loc"] == "path.id"


def test_validation_errors_name_each_field(operator, workflow):
    body = assert_error(operator.post("/runs", {"workflow": 1, "input": 2, "version": -3}), 422)
    assert [e["loc"] for e in body["errors"]] == ["workflow", "input", "version"]
    for loc in ("workflow", "input", "version"):
        assert loc in body["detail"]
    json.dumps(body)  # plain JSON all the way down

"""Text PostgreSQL cannot store (NUL, an unpaired surrogate) coming in through the API: 422 naming the field,
and nothing written. Never a 500 (issue 10, section 4)."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, Signal, Workflow
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow

from .conftest import assert_error

# Each bad value as raw JSON text: Python cannot encode a lone surrogate as UTF-8, a client sends its escape.
NUL, SURROGATE = '"a\\u0000b"', '"\\ud800"'


def with_bad(body: dict, path: tuple, bad: str, *, in_key: bool = False) -> str:
    """body as JSON text with `bad` (raw JSON) as the value at path, or as the key of a value there."""
    marker = "__BAD__"
    target = body
    for part in path[:-1]:
        target = target[part]
    if in_key:
        target[path[-1]] = {marker: 1}
        return json.dumps(body).replace(f'"{marker}"', bad)
    target[path[-1]] = marker
    return json.dumps(body).replace(f'"{marker}"', bad)


CASES = [
    pytest.param(NUL, False, "holds a NUL character", id="nul-value"),
    pytest.param(NUL, True, "the key holds a NUL character", id="nul-key"),
    pytest.param(SURROGATE, False, "holds an unpaired surrogate (U+D800)", id="surrogate-value"),
    pytest.param(SURROGATE, True, "the key holds an unpaired surrogate", id="surrogate-key"),
]


def refused(response, loc_start: str, msg: str) -> dict:
    body = assert_error(response, 422, "validation_error")
    assert len(body["errors"]) == 1, body
    error = body["errors"][0]
    assert error["loc"].startswith(loc_start) and msg in error["msg"], body
    assert loc_start in body["detail"], body
    return body


def counts() -> tuple[int, int, int, int]:
    return Run.objects.count(), JournalEvent.objects.count(), Signal.objects.count(), Workflow.objects.count()


@pytest.fixture
def hello(db):
    return make_workflow(name="hello", steps=[echo_step("only", said="{{ input.text }}")])


@pytest.fixture
def waiting_run(db):
    steps = [
        {"id": "review", "kind": "approval", "prompt": "Send it?"},
        {"id": "go", "kind": "signal", "name": "go"},
        echo_step("after"),
    ]
    run = make_run(steps=steps)
    drive_to_end(run)
    assert run.status == "waiting"
    return run


@pytest.mark.parametrize("bad, in_key, msg", CASES)
def test_a_run_input_with_unstorable_text_is_422_naming_the_field(operator, hello, bad, in_key, msg):
    before = counts()
    raw = with_bad({"workflow": "hello", "input": {"text": "ok", "note": None}}, ("input", "note"), bad, in_key=in_key)
    refused(operator.post("/runs", raw=raw), "input.note", msg)
    assert counts() == before


@pytest.mark.parametrize("bad, in_key, msg", CASES)
def test_a_workflow_definition_with_unstorable_text_is_422_naming_the_field(operator, db, bad, in_key, msg):
    before = counts()
    definition = {"name": "bad-text", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": None}]}
    refused(
        operator.post("/workflows", raw=with_bad(definition, ("steps", 0, "args"), bad, in_key=in_key)),
        "steps[0].args",
        msg,
    )
    assert counts() == before


@pytest.mark.parametrize("bad, in_key, msg", CASES)
def test_a_custom_event_with_unstorable_text_is_422_naming_the_field(operator, hello, bad, in_key, msg):
    run = make_run(workflow=hello)
    before = counts()
    raw = with_bad({"kind": "confidence_evaluated", "payload": {"why": None}}, ("payload", "why"), bad, in_key=in_key)
    refused(operator.post(f"/runs/{run.id}/events", raw=raw), "payload.why", msg)
    assert counts() == before


@pytest.mark.parametrize("bad, in_key, msg", CASES)
def test_a_signal_payload_with_unstorable_text_is_422_naming_the_field(operator, waiting_run, bad, in_key, msg):
    before = counts()
    raw = with_bad({"payload": {"answer": None}}, ("payload", "answer"), bad, in_key=in_key)
    refused(operator.post(f"/runs/{waiting_run.id}/signals/go", raw=raw), "payload.answer", msg)
    assert counts() == before


@pytest.mark.parametrize("bad, msg", [(NUL, "NUL"), (SURROGATE, "unpaired surrogate")])
def test_an_approval_comment_with_unstorable_text_is_422_and_decides_nothing(operator, waiting_run, bad, msg):
    before = counts()
    raw = with_bad({"approved": True, "comment": None}, ("comment",), bad)
    refused(operator.post(f"/runs/{waiting_run.id}/approvals/review", raw=raw), "comment", msg)
    assert counts() == before
    waiting_run.refresh_from_db()
    assert waiting_run.status == "waiting" and waiting_run.waiting_on["kind"] == "approval"


@pytest.mark.parametrize("bad, msg", [(NUL, "NUL"), (SURROGATE, "unpaired surrogate")])
def test_a_cancel_reason_with_unstorable_text_is_422_and_cancels_nothing(operator, waiting_run, bad, msg):
    before = counts()
    refused(
        operator.post(f"/runs/{waiting_run.id}/cancel", raw=with_bad({"reason": None}, ("reason",), bad)), "reason", msg
    )
    assert counts() == before
    waiting_run.refresh_from_db()
    assert waiting_run.status == "waiting"


def test_a_nul_in_the_idempotency_key_header_is_422_naming_it(operator, hello):
    before = counts()
    response = operator.post("/runs", {"workflow": "hello", "input": {}}, headers={"Idempotency-Key": "k\x00ey"})
    refused(response, "header.Idempotency-Key", "NUL")
    assert counts() == before


def test_a_nul_in_any_header_of_a_read_is_422_naming_that_header_and_clean_headers_pass(operator, hello):
    run = make_run(workflow=hello)
    refused(operator.get(f"/runs/{run.id}", headers={"X-Trace": "a\x00b"}), "header.X-Trace", "NUL")
    answered = operator.get(f"/runs/{run.id}", headers={"X-Trace": "naïve", "User-Agent": "probe/1"})
    assert answered.status_code == 200 and answered.json()["id"] == str(run.id)


def test_a_nul_in_the_address_is_422_not_a_500(operator, hello):
    assert refused(operator.get("/workflows/hel%00lo"), "path.name", "NUL")["errors"][0]["loc"] == "path.name"
    refused(operator.post("/runs/%00/approvals/x\x00", {"approved": True}), "path.", "NUL")
    refused(operator.get("/runs", {"workflow": "a\x00"}), "query.workflow", "NUL")


def test_text_that_only_looks_like_an_escape_is_accepted_as_it_is(operator, hello):
    # A literal backslash-u0000 (six characters) and the private-use character the storage escape starts with
    # are ordinary text: stored and given back unchanged.
    text = "c:\\u0000 and \ue000pal-escaped: and \U0001f600"
    response = operator.post("/runs", {"workflow": "hello", "input": {"text": text}})
    assert response.status_code == 201, response.content
    run = Run.objects.get(id=response.json()["id"])
    assert run.input == {"text": text}
    assert operator.get(f"/runs/{run.id}").json()["input"] == {"text": text}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"workflow": "hello", "input": {"text": "\\uD800"}}',
        b'{"workflow": "hello", "input": {"text": "\xed\xa0\x80"}}',
    ],
    ids=["uppercase-escape", "raw-surrogate-bytes"],
)
def test_a_surrogate_written_any_way_json_allows_is_422(operator, hello, raw):
    before = counts()
    refused(operator.post("/runs", raw=raw), "input.text", "unpaired surrogate")
    assert counts() == before

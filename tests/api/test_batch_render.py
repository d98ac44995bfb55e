"""POST /runs and POST /runs/batch answer without ninja validating run_out's dicts again (issue 15 section 1): the
same JSON, byte for byte, as ninja makes of the validated RunOut / BatchOut, for new runs and idempotent repeats."""

import pytest
from django.test import RequestFactory

from pal.api import api as ninja_api
from runs.api.runs import run_out
from runs.api.schemas import BatchOut, RunOut
from runs.models import Run
from tests.helpers import echo_step, make_workflow

pytestmark = pytest.mark.django_db


def _validated(data: dict, schema, status: int) -> bytes:
    """What ninja answered before: the dict validated against the route's schema, then rendered."""
    dumped = schema.model_validate(data).model_dump()
    return ninja_api.create_response(RequestFactory().get("/"), dumped, status=status).content


def _run_outs(ids: list[str], inputs: list) -> list[dict]:
    """run_out of each run read again; a new run's input as posted (a jsonb column gives its keys back reordered,
    the answer to the POST has them as sent), a repeat's (None) as read."""
    outs = [run_out(Run.objects.select_related("workflow", "lock").get(id=run_id)) for run_id in ids]
    return [out if input is None else {**out, "input": input} for out, input in zip(outs, inputs, strict=True)]


def test_a_batch_answer_is_byte_for_byte_what_ninja_makes_of_the_validated_batch(operator):
    first = make_workflow(name="render-a", steps=[echo_step("only", said="{{ input.n }}")])
    make_workflow(name="render-b", steps=[echo_step("one"), echo_step("two")])
    repeat = operator.post("/runs/batch", {"runs": [{"workflow": first.name, "input": {}, "idempotency_key": "k1"}]})
    assert repeat.status_code == 201, repeat.content
    body = {
        "runs": [
            {"workflow": first.name, "input": {"text": "naïve ✓", "n": 1.5, "deep": {"list": [1, None, "x"]}}},
            {"workflow": "render-b", "input": {}, "version": 1},
            {"workflow": first.name, "input": {}, "idempotency_key": "k1"},  # the same run again
            {"workflow": first.name},
        ]
    }

    answer = operator.post("/runs/batch", body)

    assert answer.status_code == 201, answer.content
    assert answer["Content-Type"] == "application/json; charset=utf-8"
    ids = [item["id"] for item in answer.json()["items"]]
    assert ids[2] == repeat.json()["items"][0]["id"] and len(set(ids)) == 4
    assert answer.content == _validated(
        {"items": _run_outs(ids, [body["runs"][0]["input"], {}, None, {}])}, BatchOut, 201
    )


def test_a_posted_run_is_byte_for_byte_what_ninja_makes_of_the_validated_run_new_or_repeated(operator):
    workflow = make_workflow(name="render-c", steps=[echo_step("only")])
    body = {"workflow": workflow.name, "input": {"text": "ünï", "list": [1, 2.5, None]}}

    created = operator.post("/runs", body, headers={"Idempotency-Key": "same"})
    repeated = operator.post("/runs", body, headers={"Idempotency-Key": "same"})

    assert (created.status_code, repeated.status_code) == (201, 200)
    assert created["Content-Type"] == repeated["Content-Type"] == "application/json; charset=utf-8"
    run_id = created.json()["id"]
    assert created.content == _validated(_run_outs([run_id], [body["input"]])[0], RunOut, 201)
    assert repeated.content == _validated(_run_outs([run_id], [None])[0], RunOut, 200)

"""GET /runs/{a}/compare/{b}: two runs step by step (status, output and where it differs, duration, tokens, cost),
graph steps and for_each items, workflows of different versions, unknown runs."""

import uuid

import pytest

from runs.compare import output_diff, step_order, text_diff
from runs.models import RunStatus
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, tool_step

from .conftest import assert_error


def llm_step(step_id: str, prompt: str, **extra) -> dict:
    return {"id": step_id, "kind": "llm_call", "model": "gpt-4o-mini", "prompt": prompt, **extra}


def _run(workflow, **input):
    run = make_run(workflow=workflow, input=input)
    drive_to_end(run)
    return run


def _compare(client, a, b) -> dict:
    response = client.get(f"/runs/{a.id}/compare/{b.id}")
    assert response.status_code == 200, response.content
    return response.json()


def _step(body: dict, step_id: str) -> dict:
    return next(s for s in body["steps"] if s["step_id"] == step_id)


def test_two_runs_of_a_workflow_compare_step_by_step_with_a_diff_where_the_outputs_differ(viewer, db):
    workflow = make_workflow(
        steps=[
            echo_step("fixed", said="hello"),
            tool_step("ask", "echo", {"q": "{{ input.q }}", "n": 1}),
            llm_step("answer", "Answer: {{ input.q }}"),
        ]
    )
    a, b = _run(workflow, q="the red fox"), _run(workflow, q="the brown fox")
    body = _compare(viewer, a, b)
    assert [s["step_id"] for s in body["steps"]] == ["fixed", "ask", "answer"]
    assert body["runs"]["a"]["id"] == str(a.id) and body["runs"]["b"]["id"] == str(b.id) and body["same_workflow"]
    fixed, ask, answer = (_step(body, sid) for sid in ("fixed", "ask", "answer"))
    assert fixed["same_output"] is True and fixed["diff"] == []
    assert fixed["a"]["status"] == fixed["b"]["status"] == "completed"
    assert isinstance(fixed["a"]["ms"], int) and fixed["a"]["ms"] >= 0
    assert ask["same_output"] is False
    assert ask["diff"] == [{"path": "q", "change": "changed", "a": "the red fox", "b": "the brown fox"}]
    # A model call: tokens and cost from its output's usage, as the receipt counts them.
    for side, run in (("a", a), ("b", b)):
        output = run.output
        assert answer[side]["output"] == output
        assert answer[side]["tokens"] == output["usage"]["prompt_tokens"] + output["usage"]["completion_tokens"] > 0
        assert answer[side]["cost_usd"] == pytest.approx(output["cost_usd"])
        assert body["totals"][side]["tokens"] == answer[side]["tokens"]
        assert body["totals"][side]["cost_usd"] == pytest.approx(output["cost_usd"])
        assert body["totals"][side]["status"] == "succeeded" and body["totals"][side]["steps_completed"] == 3
    assert "text" in {d["path"] for d in answer["diff"]}


def test_a_failed_step_against_a_completed_one_and_steps_only_one_version_has(viewer, db):
    name = f"wf-{uuid.uuid4().hex[:8]}"
    v1 = workflow_create(definition={"name": name, "steps": [echo_step("first"), tool_step("risky", "test_fail")]})
    v2 = workflow_create(
        definition={"name": name, "steps": [echo_step("first"), echo_step("added"), echo_step("risky", ok=True)]}
    )
    a, b = _run(v1), _run(v2)
    assert a.status == RunStatus.FAILED and b.status == RunStatus.SUCCEEDED
    body = _compare(viewer, a, b)
    assert [s["step_id"] for s in body["steps"]] == ["first", "added", "risky"]
    added, risky = _step(body, "added"), _step(body, "risky")
    assert added["a"] is None and added["b"]["status"] == "completed"
    assert added["same_output"] is False and added["diff"][0]["change"] == "added"
    assert risky["a"]["status"] == "failed" and risky["a"]["error"]["code"] == "test_refused"
    assert risky["a"]["output"] is None and risky["b"]["output"] == {"ok": True}
    assert risky["diff"] == [{"path": "", "change": "added", "a": None, "b": {"ok": True}}]
    assert body["totals"]["a"]["steps_failed"] == 1 and body["totals"]["b"]["steps_failed"] == 0


def test_a_for_each_step_compares_item_by_item_and_its_row_sums_its_items(viewer, db):
    workflow = make_workflow(steps=[llm_step("read", "Read {{ item }}", for_each="{{ input.items }}", needs=[])])
    a, b = _run(workflow, items=["x", "y"]), _run(workflow, items=["x", "z", "w"])
    body = _compare(viewer, a, b)
    assert [s["step_id"] for s in body["steps"]] == ["read", "read[0]", "read[1]", "read[2]"]
    read, first, second, third = body["steps"]
    assert first["item_of"] == "read" and first["index"] == 0 and first["same_output"] is True
    assert second["same_output"] is False and third["a"] is None and third["b"]["status"] == "completed"
    assert read["a"]["items"] == 2 and read["b"]["items"] == 3
    assert read["a"]["tokens"] == first["a"]["tokens"] + second["a"]["tokens"] > 0
    assert body["totals"]["b"]["tokens"] == read["b"]["tokens"]  # each item counted once


def test_a_run_not_started_yet_reads_as_steps_not_started(viewer, db):
    workflow = make_workflow(steps=[echo_step("one"), echo_step("two")])
    done, queued = _run(workflow), make_run(workflow=workflow)
    body = _compare(viewer, done, queued)
    assert [s["b"]["status"] for s in body["steps"]] == ["not_started", "not_started"]
    assert all(s["same_output"] is False for s in body["steps"])
    assert body["totals"]["b"]["ms"] is None and body["totals"]["a"]["ms"] is not None


def test_an_unknown_run_is_404_naming_it_and_a_bad_id_422(viewer, db):
    run = _run(make_workflow(steps=[echo_step("one")]))
    missing = uuid.uuid4()
    body = assert_error(viewer.get(f"/runs/{run.id}/compare/{missing}"), 404, "run_not_found")
    assert str(missing) in body["detail"]
    body = assert_error(viewer.get(f"/runs/{missing}/compare/{run.id}"), 404, "run_not_found")
    assert str(missing) in body["detail"]
    body = assert_error(viewer.get(f"/runs/{run.id}/compare/nope"), 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == ["path.b"]


def test_comparing_needs_a_viewer(nobody, anonymous, db):
    run = _run(make_workflow(steps=[echo_step("one")]))
    assert_error(nobody.get(f"/runs/{run.id}/compare/{run.id}"), 403)
    assert_error(anonymous.get(f"/runs/{run.id}/compare/{run.id}"), 401)


def test_a_configured_secret_in_an_output_never_reaches_the_comparison(viewer, db, settings):
    settings.PAL_WEBHOOK_SECRET = "hush-hush-0123456789"
    workflow = make_workflow(steps=[tool_step("leak", "echo", {"said": "{{ input.said }}"})])
    a, b = _run(workflow, said="key hush-hush-0123456789 here"), _run(workflow, said="nothing")
    response = viewer.get(f"/runs/{a.id}/compare/{b.id}")
    assert response.status_code == 200
    assert b"hush-hush-0123456789" not in response.content
    assert _step(response.json(), "leak")["a"]["output"] == {"said": "key [redacted] here"}


# --- the pure parts ---------------------------------------------------------------------------------


def test_the_step_order_puts_a_step_only_b_has_after_the_step_it_follows_there():
    assert step_order(["a", "b", "d"], ["a", "c", "b", "e", "d"]) == ["a", "c", "b", "e", "d"]
    assert step_order(["x"], ["new", "x"]) == ["new", "x"]
    assert step_order([], ["p", "q"]) == ["p", "q"]


def test_the_output_diff_names_each_path_that_differs():
    a = {"text": "hi", "usage": {"prompt_tokens": 3}, "list": [1, 2], "gone": 1}
    b = {"text": "hi", "usage": {"prompt_tokens": 4}, "list": [1, 2, 3], "new": True}
    assert output_diff(a, b) == [
        {"path": "usage.prompt_tokens", "change": "changed", "a": 3, "b": 4},
        {"path": "list[2]", "change": "added", "a": None, "b": 3},
        {"path": "gone", "change": "removed", "a": 1, "b": None},
        {"path": "new", "change": "added", "a": None, "b": True},
    ]
    assert output_diff(1, True) == [{"path": "", "change": "changed", "a": 1, "b": True}]
    assert len(output_diff(list(range(500)), list(range(1, 501)))) == 100


def test_the_text_diff_marks_the_words_that_changed():
    assert text_diff("the red fox jumps", "the brown fox jumps") == [
        ("same", "the "),
        ("del", "red"),
        ("add", "brown"),
        ("same", " fox jumps"),
    ]
    assert text_diff("x" * 30_000, "y") is None

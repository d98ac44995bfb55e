"""GET /runs/{id}/steps/{step_id} (CONTRACT section 6): every attempt of one step, or one item "read[3]", with its
input, output, error, timing, tokens, cost, key, side effects and child run, folded from the journal. Runs are
driven inline (tests.helpers.drive); a crash is tests.helpers' Crash, the process dying mid-step."""

import pytest

from journal.services import NewEvent
from runs.models import Run, RunStatus
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import (
    Crash,
    drive,
    drive_to_end,
    echo_step,
    journal_by_hand,
    make_run,
    make_workflow,
    sweep_after_expiry,
    tool_step,
)

from .conftest import assert_error

pytestmark = pytest.mark.django_db

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
SECRET = "sk-planted-provider-key-0123456789"


def detail(client, run, step_id: str) -> dict:
    response = client.get(f"/runs/{run.id}/steps/{step_id}")
    assert response.status_code == 200, response.content[:500]
    return response.json()


def test_a_model_calls_attempt_answers_its_prompt_its_answer_tokens_cost_and_key(viewer):
    run = make_run(steps=[{"id": "plan", **LLM, "prompt": "Plan {{ input.q }}"}], input={"q": "the launch"})
    drive_to_end(run)

    body = detail(viewer, run, "plan")

    assert (body["step_id"], body["kind"], body["needs"], body["items"]) == ("plan", "llm_call", [], None)
    (attempt,) = body["attempts"]
    assert attempt["attempt"] == 1 and attempt["item"] is None and attempt["status"] == "completed"
    assert attempt["key"] == f"{run.id}:plan:1"
    assert attempt["input"]["prompt"] == "Plan the launch"
    assert attempt["output"]["text"] == run.output["text"]
    usage = run.output["usage"]
    assert (attempt["prompt_tokens"], attempt["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert attempt["tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert attempt["cost_usd"] == run.output["cost_usd"] > 0
    assert attempt["model"] == "gpt-4o-mini"
    assert attempt["started_at"] <= attempt["ended_at"] and attempt["ms"] >= 0
    assert (attempt["executions"], attempt["error"], attempt["side_effects"]) == (1, None, [])


def test_a_step_that_failed_twice_before_succeeding_lists_three_attempts_each_with_its_own_key_and_error(viewer):
    retry = {"max_attempts": 3, "backoff_seconds": 0}
    run = make_run(steps=[tool_step("flaky", "test_fail_before", {"succeed_on": 3}, retry=retry)])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    attempts = detail(viewer, run, "flaky")["attempts"]

    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "completed")]
    assert [a["key"] for a in attempts] == [f"{run.id}:flaky:{n}" for n in (1, 2, 3)]
    assert attempts[0]["error"]["code"] == "test_refused" and "attempt 1" in attempts[0]["error"]["message"]
    assert attempts[0]["output"] is None and attempts[2]["output"] == {"succeed_on": 3}
    assert attempts[2]["error"] is None
    assert all(a["input"]["args"] == {"succeed_on": 3} for a in attempts)


def test_a_for_each_step_lists_its_own_attempt_then_each_items_attempts_by_index(viewer):
    run = make_run(
        steps=[echo_step("plan", n=1), tool_step("read", "echo", {"i": "{{ index }}"}, for_each="{{ input.items }}")],
        input={"items": ["a", "b", "c"]},
    )
    drive_to_end(run)

    body = detail(viewer, run, "read")

    assert (body["needs"], body["items"]) == (["plan"], 3)
    assert [(a["step_id"], a["item"]) for a in body["attempts"]] == [
        ("read", None),
        ("read[0]", 0),
        ("read[1]", 1),
        ("read[2]", 2),
    ]
    own, *items = body["attempts"]
    assert own["output"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [a["output"] for a in items] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [a["key"] for a in items] == [f"{run.id}:read[{n}]:1" for n in range(3)]


def test_an_item_id_in_the_path_answers_that_items_attempts_only(viewer):
    run = make_run(
        steps=[tool_step("read", "echo", {"i": "{{ index }}", "v": "{{ item }}"}, for_each="{{ input.items }}")],
        input={"items": ["a", "b", "c"]},
    )
    drive_to_end(run)

    body = detail(viewer, run, "read[1]")

    assert (body["step_id"], body["kind"], body["items"]) == ("read[1]", "tool_call", 3)
    (attempt,) = body["attempts"]
    assert (attempt["item"], attempt["status"], attempt["output"]) == (1, "completed", {"i": 1, "v": "b"})
    assert attempt["input"]["args"] == {"i": 1, "v": "b"}


def test_a_skipped_step_has_one_entry_with_status_skipped_and_the_value_that_decided(viewer):
    run = make_run(
        steps=[echo_step("plan", n=1), {**echo_step("mail"), "needs": ["plan"], "when": "steps.plan.output.n == 2"}]
    )
    drive_to_end(run)

    (entry,) = detail(viewer, run, "mail")["attempts"]

    assert (entry["status"], entry["attempt"], entry["key"], entry["output"]) == ("skipped", None, None, None)
    assert entry["skipped"] == {"when": "steps.plan.output.n == 2", "value": False}


def test_an_attempt_resumed_after_a_crash_counts_two_executions_under_one_key(viewer):
    run = make_run(steps=[tool_step("once", "test_crash_once", {"x": 1})])
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    (attempt,) = detail(viewer, run, "once")["attempts"]

    assert (attempt["attempt"], attempt["executions"], attempt["status"]) == (1, 2, "completed")
    assert attempt["key"] == f"{run.id}:once:1"
    assert attempt["input"]["args"] == {"x": 1}  # journaled by the first execution only


def test_a_delivered_webhook_shows_its_side_effect_on_its_attempt(viewer, webhook_receiver, settings):
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    url = webhook_receiver.url
    run = make_run(steps=[{"id": "hook", "kind": "deliver", "channel": "webhook", "url": url, "body": {"a": 1}}])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    (attempt,) = detail(viewer, run, "hook")["attempts"]

    (effect,) = attempt["side_effects"]
    assert (effect["key"], effect["channel"], effect["status"]) == (f"{run.id}:hook:1", "webhook", "delivered")
    assert effect["target"] == url and effect["delivered_at"] is not None
    assert WEBHOOK_SECRET not in str(attempt)


def test_a_child_run_step_links_its_child_run(viewer):
    child_workflow = make_workflow(steps=[echo_step("answer", ok=True)])
    run = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": child_workflow.name, "input": {"q": 1}}])
    drive_to_end(run)
    child = Run.objects.get(parent_run_id=run.id)

    (attempt,) = detail(viewer, run, "sub")["attempts"]

    assert (attempt["child_run_id"], attempt["child_status"]) == (str(child.id), "succeeded")
    assert attempt["output"] == {"ok": True}


def test_an_approval_the_run_waits_on_is_waiting_and_says_on_what(viewer):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Send it?"}])
    drive(run)
    assert run.status == RunStatus.WAITING

    (attempt,) = detail(viewer, run, "review")["attempts"]

    assert (attempt["status"], attempt["waiting_on"]["kind"], attempt["ended_at"]) == ("waiting", "approval", None)
    assert attempt["input"]["prompt"] == "Send it?"


def test_a_row_from_before_step_inputs_answers_input_null(viewer):
    run = make_run(steps=[echo_step("old")])
    journal_by_hand(
        run,
        NewEvent("step_started", "old", 1, {"key": f"{run.id}:old:1", "kind": "tool_call"}),
        NewEvent("step_completed", "old", 1, {"output": {"ok": 1}, "ms": 2.5}),
    )

    (attempt,) = detail(viewer, run, "old")["attempts"]

    assert (attempt["input"], attempt["output"], attempt["status"]) == (None, {"ok": 1}, "completed")
    assert attempt["ms"] == 2.5


def test_a_step_that_has_not_started_answers_no_attempts(viewer):
    run = make_run(steps=[echo_step("first"), echo_step("second")])

    body = detail(viewer, run, "second")

    assert (body["needs"], body["attempts"]) == (["first"], [])


def test_a_secret_value_that_reached_the_journal_never_shows_in_the_answer(viewer, settings):
    settings.PAL_LLM_API_KEY = SECRET
    run = make_run(steps=[{"id": "plan", **LLM, "prompt": "hi"}])
    journal_by_hand(
        run,
        NewEvent("step_started", "plan", 1, {"key": "k", "kind": "llm_call", "input": {"prompt": f"key {SECRET}"}}),
        NewEvent("step_failed", "plan", 1, {"message": f"provider said {SECRET}", "code": "x", "permanent": True}),
    )

    response = viewer.get(f"/runs/{run.id}/steps/plan")

    assert response.status_code == 200 and SECRET not in response.content.decode()
    (attempt,) = response.json()["attempts"]
    assert attempt["input"]["prompt"] == "key [redacted]" and attempt["error"]["message"] == "provider said [redacted]"


def test_an_unknown_step_is_a_404_that_names_it(viewer):
    run = make_run(steps=[echo_step("only"), tool_step("fan", "echo", {}, for_each="{{ input.items }}")])

    body = assert_error(viewer.get(f"/runs/{run.id}/steps/nope"), 404, "step_not_found")
    assert "'nope'" in body["detail"] and "only, fan" in body["detail"]
    body = assert_error(viewer.get(f"/runs/{run.id}/steps/only[0]"), 404, "step_not_found")
    assert "not a for_each step" in body["detail"]
    body = assert_error(viewer.get(f"/runs/{run.id}/steps/fan[2]"), 404, "step_not_found")
    assert "fan[2]" in body["detail"] and "has not started its items" in body["detail"]


def test_an_item_past_the_end_of_its_list_is_a_404_saying_how_many_there_are(viewer):
    run = make_run(steps=[tool_step("fan", "echo", {}, for_each="{{ input.items }}")], input={"items": [1, 2]})
    drive_to_end(run)

    body = assert_error(viewer.get(f"/runs/{run.id}/steps/fan[2]"), 404, "step_not_found")
    assert "fan has 2 items" in body["detail"]


def test_reading_a_step_needs_a_viewer_token(anonymous, nobody, viewer):
    run = make_run(steps=[echo_step("only")])

    assert_error(anonymous.get(f"/runs/{run.id}/steps/only"), 401)
    assert_error(nobody.get(f"/runs/{run.id}/steps/only"), 403)
    assert_error(viewer.get("/runs/00000000-0000-0000-0000-000000000000/steps/only"), 404)

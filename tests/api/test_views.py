"""The waterfall, the receipt and the re-drive preview, all read from the journal."""

import uuid
from decimal import Decimal

import pytest
from django.test import override_settings

from journal.receipts import receipt_build
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import Crash, drive, drive_to_end, make_run, sweep_after_expiry, tool_step

from .conftest import assert_error

LLM = {
    "id": "draft",
    "kind": "llm_call",
    "model": "gpt-4o-mini",
    "provider": "fake",
    "prompt": "Summarise {{ input.t }}",
}


def crashed_in_second_step():
    """draft (an llm_call) completed, then the worker died inside crash; the sweep re-drove the run."""
    run = make_run(steps=[LLM, tool_step("crash", "test_crash_once")], input={"t": "printer on fire"})
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)
    return run


def test_the_waterfall_has_a_bar_per_step_attempt(viewer):
    run = make_run(
        steps=[LLM, tool_step("flaky", "test_fail_before", {"succeed_on": 2}, retry={"max_attempts": 2})],
        input={"t": "x"},
    )
    drive_to_end(run)
    body = viewer.get(f"/runs/{run.id}/waterfall").json()
    assert body["run"]["id"] == str(run.id) and body["run"]["status"] == "succeeded"
    bars = [(b["step_id"], b["kind"], b["attempt"], b["status"], b["cached"]) for b in body["bars"]]
    assert bars == [
        ("draft", "llm_call", 1, "completed", False),
        ("flaky", "tool_call", 1, "failed", False),
        ("flaky", "tool_call", 2, "completed", False),
    ]
    for bar in body["bars"]:
        assert bar["started_at"] <= bar["ended_at"] and bar["child_run_id"] is None


def test_a_step_reused_after_a_redrive_is_a_cached_bar(viewer):
    run = crashed_in_second_step()
    drive_to_end(run)
    bars = [
        (b["step_id"], b["attempt"], b["status"], b["cached"])
        for b in viewer.get(f"/runs/{run.id}/waterfall").json()["bars"]
    ]
    assert bars == [
        ("draft", 1, "completed", False),
        ("crash", 1, "interrupted", False),  # the worker died inside it
        ("draft", 1, "completed", True),  # reused by the re-drive: not run again
        ("crash", 1, "completed", False),  # the same attempt, run again under the same key
    ]


def test_a_waiting_step_shows_as_waiting(viewer):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(run)
    [bar] = viewer.get(f"/runs/{run.id}/waterfall").json()["bars"]
    assert (bar["step_id"], bar["status"], bar["ended_at"]) == ("review", "waiting", None)


def test_a_child_run_step_names_its_child(viewer):
    from runs.models import Run
    from tests.helpers import echo_step, make_workflow

    make_workflow(name="research", steps=[echo_step("look")])
    run = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "research", "input": {}}])
    drive_to_end(run)
    child = Run.objects.get(parent_run=run)
    [bar] = viewer.get(f"/runs/{run.id}/waterfall").json()["bars"]
    assert (bar["step_id"], bar["kind"], bar["child_run_id"]) == ("sub", "child_run", str(child.id))


def test_the_receipt_lists_attempts_keys_tokens_cost_and_redrives(viewer):
    run = crashed_in_second_step()
    drive_to_end(run)
    body = viewer.get(f"/runs/{run.id}/receipt").json()
    assert body["format"] == "pal-receipt/1" and body["status"] == "succeeded"
    assert body["workflow"]["name"] == run.workflow.name
    draft, crash = body["steps"]
    assert draft["key"] == f"{run.id}:draft:1" and draft["kind"] == "llm_call" and draft["executions"] == 1
    assert draft["prompt_tokens"] > 0 and draft["completion_tokens"] > 0 and Decimal(draft["cost_usd"]) > 0
    assert draft["model"] == "gpt-4o-mini"
    assert crash["key"] == f"{run.id}:crash:1" and crash["executions"] == 2 and crash["status"] == "completed"
    assert [r["by"] for r in body["redrives"]] == ["sweep"]
    assert [r["by"] for r in draft["reused"]] == ["sweep"] and crash["reused"] == []
    assert body["totals"]["prompt_tokens"] == draft["prompt_tokens"]
    assert body["totals"]["cost_usd"] == draft["cost_usd"]
    assert body["journal"]["last_seq"] == body["journal"]["events"] == body["journal"]["head_seq"]
    assert len(body["journal"]["head_hash"]) == 64
    assert body["journal"]["recorded_head"] == {
        "seq": body["journal"]["head_seq"],
        "hash": body["journal"]["head_hash"],
    }
    assert body["signed"] is None and body["signature"] is None  # no key configured in the tests


def test_the_receipt_digest_is_stable(db):
    run = make_run()
    drive_to_end(run)
    assert receipt_build(run_id=run.id) == receipt_build(run_id=run.id)


def test_the_receipt_shows_side_effects_retries_approvals_and_custom_events(viewer, operator, webhook_receiver):
    steps = [
        {"id": "hook", "kind": "deliver", "channel": "webhook", "url": webhook_receiver.url, "body": {"a": 1}},
        {"id": "review", "kind": "approval", "prompt": "go?"},
        tool_step("flaky", "test_fail_before", {"succeed_on": 2}),
    ]
    with override_settings(PAL_WEBHOOK_SECRET=WEBHOOK_SECRET):
        run = make_run(steps=steps)
        drive(run)
        operator.post(f"/runs/{run.id}/approvals/review", {"approved": True, "comment": "yes"})
        drive_to_end(run)
        operator.post(f"/runs/{run.id}/retry", {"reason": "flaky"})
        drive_to_end(run)
    operator.post(f"/runs/{run.id}/events", {"kind": "confidence_evaluated", "payload": {"score": 1}})
    body = viewer.get(f"/runs/{run.id}/receipt").json()
    assert body["status"] == "succeeded"
    hook = next(s for s in body["steps"] if s["step_id"] == "hook")
    assert [(e["key"], e["channel"], e["status"]) for e in hook["side_effects"]] == [
        (f"{run.id}:hook:1", "webhook", "delivered")
    ]
    assert [(s["step_id"], s["attempt"], s["status"]) for s in body["steps"] if s["step_id"] == "flaky"] == [
        ("flaky", 1, "failed"),
        ("flaky", 2, "completed"),
    ]
    assert [(r["step_id"], r["attempt"], r["by"]) for r in body["retries"]] == [("flaky", 2, "otto")]
    assert [(a["step_id"], a["approved"], a["by"]) for a in body["approvals"]] == [("review", True, "otto")]
    assert [c["kind"] for c in body["custom_events"]] == ["confidence_evaluated"]
    assert body["totals"]["side_effects"] == 1 and body["totals"]["retries"] == 1


def test_the_redrive_preview_says_what_is_reused_and_what_runs_again(viewer):
    run = make_run(
        steps=[LLM, tool_step("crash", "test_crash_once"), tool_step("last", "test_count")], input={"t": "x"}
    )
    with pytest.raises(Crash):
        drive(run)
    body = viewer.get(f"/runs/{run.id}/redrive/preview").json()
    assert body["can_redrive"] is True and body["needs_force"] is True  # the dead worker's lease has not expired
    [reused] = body["reused"]
    assert (reused["step_id"], reused["attempt"]) == ("draft", 1)
    assert reused["prompt_tokens"] > 0 and reused["cost_usd"] > 0
    assert body["saved"]["prompt_tokens"] == reused["prompt_tokens"]
    assert [(s["step_id"], s["attempt"], s["resumes"]) for s in body["rerun"]] == [
        ("crash", 1, True),
        ("last", 1, False),
    ]


def test_the_redrive_preview_names_open_side_effects(viewer, db):
    from django.utils import timezone

    from runs.models import SideEffect

    run = make_run()
    SideEffect.objects.create(
        key=f"{run.id}:hook:1",
        run=run,
        step_id="hook",
        attempt=1,
        channel="webhook",
        target="http://x/hook",
        claimed_at=timezone.now(),
    )
    SideEffect.objects.create(
        key=f"{run.id}:mail:1",
        run=run,
        step_id="mail",
        attempt=1,
        channel="email",
        target="a@b.c",
        status="unconfirmed",
        claimed_at=timezone.now(),
    )
    effects = {e["key"]: e for e in viewer.get(f"/runs/{run.id}/redrive/preview").json()["side_effects"]}
    assert "same Idempotency-Key" in effects[f"{run.id}:hook:1"]["on_redrive"]
    assert effects[f"{run.id}:mail:1"]["status"] == "unconfirmed"


def test_an_ended_run_cannot_be_redriven_says_the_preview(viewer):
    run = make_run()
    drive_to_end(run)
    body = viewer.get(f"/runs/{run.id}/redrive/preview").json()
    assert body["can_redrive"] is False and body["needs_force"] is False and body["rerun"] == []


@pytest.mark.parametrize("view", ["waterfall", "receipt", "redrive/preview"])
def test_views_of_an_unknown_run_are_404(viewer, view):
    assert_error(viewer.get(f"/runs/{uuid.uuid4()}/{view}"), 404, "run_not_found")

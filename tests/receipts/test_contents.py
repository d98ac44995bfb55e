"""What a receipt says: every step attempt with its key, times, outcome, model, tokens and cost; side effects;
re-drives with who and why and the steps they reused; child runs nested with their totals rolled up."""

from decimal import Decimal

import pytest
from django.test import override_settings

from runs.api.receipt_schemas import ReceiptChildOut, ReceiptOut, ReceiptStepOut
from runs.models import Run
from runs.receipts import receipt_consistency_problem, run_receipt
from runs.services import run_cancel, run_redrive, run_retry
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import (
    CRASHING_MAIL,
    LOCMEM_MAIL,
    Crash,
    drive,
    drive_to_end,
    echo_step,
    mailer,
    make_run,
    make_workflow,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db


def llm(step_id: str, model: str = "gpt-4o-mini", prompt: str = "Summarise {{ input.t }}") -> dict:
    return {"id": step_id, "kind": "llm_call", "model": model, "provider": "fake", "prompt": prompt}


def child(step_id: str, workflow: str) -> dict:
    return {"id": step_id, "kind": "child_run", "workflow": workflow, "input": {"t": "{{ input.t }}"}}


def step(receipt, step_id, attempt=1):
    return next(s for s in receipt["steps"] if s["step_id"] == step_id and s["attempt"] == attempt)


# --- per step attempt ------------------------------------------------------------------------------


def test_each_attempt_has_its_key_kind_times_duration_outcome_model_tokens_and_cost():
    run = make_run(
        steps=[llm("draft"), tool_step("flaky", "test_fail_before", {"succeed_on": 2}, retry={"max_attempts": 2})],
        input={"t": "a b c"},
    )
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    assert receipt["run_id"] == str(run.id) and receipt["workflow"] == {"name": run.workflow.name, "version": 1}
    assert receipt["status"] == "succeeded" and receipt["parent"] is None and receipt["depth"] == 0
    draft = step(receipt, "draft")
    assert (draft["key"], draft["kind"], draft["status"], draft["model"]) == (
        f"{run.id}:draft:1",
        "llm_call",
        "completed",
        "gpt-4o-mini",
    )
    assert draft["started_at"] <= draft["ended_at"] and Decimal(draft["duration_seconds"]) >= 0
    assert draft["total_tokens"] == draft["prompt_tokens"] + draft["completion_tokens"] > 0
    prompt_price, completion_price = (Decimal(str(p)) for p in [0.00015, 0.0006])
    assert (
        Decimal(draft["cost_usd"])
        == (draft["prompt_tokens"] * prompt_price + draft["completion_tokens"] * completion_price) / 1000
    )
    first, second = step(receipt, "flaky", 1), step(receipt, "flaky", 2)
    assert (first["status"], first["error"]["code"], first["key"]) == ("failed", "test_refused", f"{run.id}:flaky:1")
    assert (second["status"], second["key"], second["cost_usd"], second["model"]) == (
        "completed",
        f"{run.id}:flaky:2",
        "0",
        None,
    )
    assert receipt["totals"]["attempts"] == 3 and receipt["totals"]["cost_usd"] == draft["cost_usd"]
    assert receipt_consistency_problem(receipt) is None


def test_prices_per_model_come_from_the_settings():
    with override_settings(PAL_LLM_PRICES={"gpt-4o-mini": [1, 2], "fake": [0, 0]}):
        run = make_run(steps=[llm("draft")], input={"t": "one two"})
        drive_to_end(run)
    draft = step(run_receipt(run_id=run.id), "draft")
    assert Decimal(draft["cost_usd"]) == Decimal(draft["prompt_tokens"] * 1 + draft["completion_tokens"] * 2) / 1000


def test_numbers_are_integers_and_money_is_a_decimal_string():
    run = make_run(steps=[llm("draft")], input={"t": "x"})
    drive_to_end(run)

    def walk(value):
        assert not isinstance(value, float), value
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    receipt = run_receipt(run_id=run.id)
    walk(receipt)
    assert isinstance(receipt["totals"]["cost_usd"], str) and "e" not in receipt["totals"]["cost_usd"].lower()


def test_the_receipt_matches_its_documented_schema_field_for_field():
    make_workflow(name="leaf", steps=[llm("look")])
    run = make_run(steps=[llm("draft"), child("sub", "leaf")], input={"t": "x"})
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    ReceiptOut.model_validate(receipt)
    assert set(receipt) == set(ReceiptOut.model_fields)
    assert set(receipt["children"][0]) == set(ReceiptChildOut.model_fields)
    assert set(receipt["steps"][0]) == set(ReceiptStepOut.model_fields)


# --- side effects, re-drives, retries, cancellations ------------------------------------------------


def test_every_side_effect_has_its_key_channel_target_and_status(webhook_receiver):
    steps = [
        {
            "id": "hook",
            "kind": "deliver",
            "channel": "webhook",
            "url": webhook_receiver.url + "?token=abc123&x=1",
            "body": {"a": 1},
        },
        {"id": "mail", "kind": "deliver", "channel": "email", "to": ["ops@example.com"], "subject": "s", "body": "b"},
    ]
    with override_settings(PAL_WEBHOOK_SECRET=WEBHOOK_SECRET):
        run = make_run(steps=steps)
        drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    effects = [e for s in receipt["steps"] for e in s["side_effects"]]
    assert [(e["key"], e["channel"], e["status"]) for e in effects] == [
        (f"{run.id}:hook:1", "webhook", "delivered"),
        (f"{run.id}:mail:1", "email", "delivered"),
    ]
    hook, mail = effects
    assert hook["target"] == webhook_receiver.url + "?token=***&x=1"  # a credential in a URL stays out
    assert mail["target"] == "ops@example.com"
    assert receipt["totals"]["side_effects"] == 2


def test_a_redrive_names_who_and_why_and_marks_the_steps_it_reused():
    run = make_run(steps=[llm("draft"), tool_step("crash", "test_crash_once")], input={"t": "x"})
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)  # the sweep re-drives it
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    [redrive] = receipt["redrives"]
    assert redrive["by"] == "sweep" and redrive["why"]
    draft, crash = step(receipt, "draft"), step(receipt, "crash")
    assert [(r["kind"], r["by"], r["seq"]) for r in draft["reused"]] == [("redriven", "sweep", redrive["seq"])]
    assert draft["executions"] == 1 and crash["executions"] == 2 and crash["reused"] == []
    assert receipt["totals"]["reused"] == 1 and receipt["totals"]["redrives"] == 1


def test_an_operators_redrive_is_recorded_with_their_name_and_reason():
    run = make_run(steps=[echo_step("first"), tool_step("crash", "test_crash_once")])
    with pytest.raises(Crash):
        drive(run)
    run_redrive(run_id=run.id, by="otto", reason="the worker host was rebooted", force=True)
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    assert [(r["by"], r["why"], r["force"]) for r in receipt["redrives"]] == [
        ("otto", "the worker host was rebooted", True)
    ]
    assert [r["by"] for r in step(receipt, "first")["reused"]] == ["otto"]


def test_a_retry_reuses_the_steps_before_the_failed_one():
    run = make_run(steps=[llm("draft"), tool_step("flaky", "test_fail_before", {"succeed_on": 2})], input={"t": "x"})
    drive_to_end(run)
    run_retry(run_id=run.id, by="otto", reason="the tool is fixed")
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    assert [(r["kind"], r["by"], r["why"]) for r in step(receipt, "draft")["reused"]] == [
        ("retried", "otto", "the tool is fixed")
    ]
    assert step(receipt, "flaky", 1)["reused"] == [] and step(receipt, "flaky", 2)["status"] == "completed"


def test_a_cancellation_says_who_and_why():
    run = make_run(steps=[{"id": "wait", "kind": "approval", "prompt": "ok?"}])
    drive_to_end(run)
    run_cancel(run_id=run.id, by="alice", reason="not needed any more")
    receipt = run_receipt(run_id=run.id)
    assert receipt["status"] == "cancelled"
    assert (receipt["cancellation"]["by"], receipt["cancellation"]["why"]) == ("alice", "not needed any more")


# --- children ---------------------------------------------------------------------------------------


def test_children_are_nested_receipts_and_totals_roll_up_over_the_tree():
    make_workflow(name="leaf", steps=[llm("deep", model="gpt-4o")])
    make_workflow(name="middle", steps=[llm("look"), child("down", "leaf")])
    run = make_run(steps=[llm("draft"), child("sub", "middle"), child("again", "leaf")], input={"t": "a b c d"})
    drive_to_end(run)
    assert run.status == "succeeded"
    receipt = run_receipt(run_id=run.id)

    middle, leaf = receipt["children"]
    grandchild = Run.objects.get(parent_run_id=middle["run_id"])
    assert middle["parent"] == {"run_id": str(run.id), "step_id": "sub", "attempt": 1} and middle["depth"] == 1
    assert step(receipt, "sub")["child_run_id"] == middle["run_id"]
    assert step(receipt, "again")["child_run_id"] == leaf["run_id"]
    [nested] = middle["children"]
    assert nested["run_id"] == str(grandchild.id) and nested["depth"] == 2 and nested["children"] == []
    assert "signature" not in middle and "signed" not in middle  # the root's signature covers them

    # A run's own totals count its own llm calls only: a child_run step's output is its child's, counted there.
    assert receipt["totals"]["prompt_tokens"] == step(receipt, "draft")["prompt_tokens"]
    assert receipt["totals"]["cost_usd"] == step(receipt, "draft")["cost_usd"]
    assert middle["totals"]["cost_usd"] == step(middle, "look")["cost_usd"]
    tree = receipt["tree_totals"]
    everyone = [receipt, middle, nested, leaf]
    assert tree["runs"] == 4
    assert tree["total_tokens"] == sum(r["totals"]["total_tokens"] for r in everyone)
    assert Decimal(tree["cost_usd"]) == sum(Decimal(r["totals"]["cost_usd"]) for r in everyone)
    assert Decimal(middle["tree_totals"]["cost_usd"]) == Decimal(middle["totals"]["cost_usd"]) + Decimal(
        nested["totals"]["cost_usd"]
    )
    deep = step(nested, "deep")
    assert deep["model"] == "gpt-4o"
    assert (
        Decimal(deep["cost_usd"])
        == (deep["prompt_tokens"] * Decimal("0.0025") + deep["completion_tokens"] * Decimal("0.01")) / 1000
    )
    assert receipt_consistency_problem(receipt) is None


def test_a_childs_own_receipt_is_signed_on_its_own_when_asked_for(viewer):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    make_workflow(name="leaf", steps=[llm("look")])
    run = make_run(steps=[child("sub", "leaf")], input={"t": "x"})
    drive_to_end(run)
    kid = Run.objects.get(parent_run=run)
    with override_settings(PAL_RECEIPT_PRIVATE_KEY=Ed25519PrivateKey.generate()):
        body = viewer.get(f"/runs/{kid.id}/receipt").json()
    assert body["parent"]["run_id"] == str(run.id) and body["signature"]


def test_an_operators_decision_on_a_side_effect_of_an_ended_run_keeps_the_run_verifiable(settings):
    """side_effect_resolve journals on a run that has ended: the recorded head moves with it."""
    from runs.services import side_effect_resolve
    from tests.journal.test_chain import verify

    settings.MAILERS = mailer(CRASHING_MAIL)
    run = make_run(
        steps=[
            {
                "id": "mail",
                "kind": "deliver",
                "channel": "email",
                "to": ["ops@example.com"],
                "subject": "s",
                "body": "b",
            },
            echo_step("after"),
        ]
    )
    with pytest.raises(Crash):
        drive(run)
    settings.MAILERS = mailer(LOCMEM_MAIL)
    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == "succeeded"
    side_effect_resolve(key=f"{run.id}:mail:1", decision="mark_delivered", by="olga", reason="confirmed by phone")
    assert verify(run.id)[0] == 0
    [effect] = step(run_receipt(run_id=run.id), "mail")["side_effects"]
    assert effect["status"] == "delivered"

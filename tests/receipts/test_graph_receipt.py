"""The receipt of a graph (issue 12): each item of a for_each step is an attempt of its own under its step, its
tokens and cost counted once; a skipped step is listed with the value of its `when`; pal_verify still holds."""

import pytest

from journal.receipts import attempts_of
from runs.api.receipt_schemas import (
    ReceiptForEachStepOut,
    ReceiptItemOut,
    ReceiptOut,
    ReceiptSkippedStepOut,
    ReceiptStepOut,
)
from runs.models import Run, RunStatus
from runs.receipts import receipt_consistency_problem, receipt_file_verify, run_receipt, run_verify
from runs.services import run_retry
from runs.steps.tools import tool
from tests.helpers import (
    Crash,
    _first_time,
    _record,
    calls,
    drive,
    drive_to_end,
    make_run,
    make_workflow,
    sweep_after_expiry,
)
from tests.helpers import tool_step as tool_call

pytestmark = pytest.mark.django_db

TEXTS = ["alpha beta", "gamma delta epsilon", "zeta"]


@tool("test_receipt_crash_when_asked")
def crash_when_asked(args, ctx):
    """Dies (the 'process' crashes) the first time it runs with {"crash": true}; returns its args otherwise."""
    _record(args, ctx)
    if args.get("crash") and _first_time(ctx):
        raise Crash(f"crash in {ctx.step_id}")
    return args


def summarise(step_id: str, prompt: str, **extra) -> dict:
    return {"id": step_id, "kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake", "prompt": prompt, **extra}


def entry(receipt, step_id, attempt=1):
    return next(s for s in receipt["steps"] if s["step_id"] == step_id and s["attempt"] == attempt)


def items_of(receipt, step_id) -> list[tuple[str, int, str]]:
    return [(i["step_id"], i["attempt"], i["status"]) for i in entry(receipt, step_id)["items"]]


def test_each_item_of_a_for_each_llm_call_is_counted_once_under_its_step_as_the_same_calls_in_a_list_are():
    fan = make_run(
        steps=[summarise("sum", "Summarise {{ item }}", for_each="{{ input.texts }}")], input={"texts": TEXTS}
    )
    listed = make_run(steps=[summarise(f"s{i}", f"Summarise {text}") for i, text in enumerate(TEXTS)])
    drive_to_end(fan)
    drive_to_end(listed)
    assert fan.status == listed.status == RunStatus.SUCCEEDED

    receipt, plain = run_receipt(run_id=fan.id), run_receipt(run_id=listed.id)

    [step] = receipt["steps"]
    assert [(i["step_id"], i["index"], i["key"]) for i in step["items"]] == [
        (f"sum[{i}]", i, f"{fan.id}:sum[{i}]:1") for i in range(3)
    ]
    for item, same in zip(step["items"], plain["steps"], strict=True):
        assert (item["kind"], item["model"], item["status"], item["executions"]) == (
            "llm_call",
            "gpt-4o-mini",
            "completed",
            1,
        )
        assert (item["prompt_tokens"], item["completion_tokens"], item["cost_usd"]) == (
            same["prompt_tokens"],
            same["completion_tokens"],
            same["cost_usd"],
        )
        assert item["cost_usd"] != "0"
    # The for_each step's output is the list of its items' outputs: its usage is the items', not counted again.
    assert (step["prompt_tokens"], step["total_tokens"], step["cost_usd"]) == (0, 0, "0")
    for name in ("prompt_tokens", "completion_tokens", "total_tokens", "cost_usd"):
        assert receipt["totals"][name] == plain["totals"][name]
    assert receipt["tree_totals"]["total_tokens"] == plain["totals"]["total_tokens"]
    assert (receipt["totals"]["attempts"], receipt["totals"]["executions"]) == (4, 4)  # the step and its 3 items
    assert receipt_consistency_problem(receipt) is None


def test_a_skipped_step_is_listed_as_skipped_with_its_when_and_the_value_that_decided():
    run = make_run(
        steps=[
            tool_call("triage", "echo", {"severity": "low"}),
            summarise("escalate", "Escalate {{ input.t }}", when="steps.triage.output.severity == 'high'"),
            tool_call("close", "echo", {"done": True}),
        ]
    )
    drive_to_end(run)

    receipt = run_receipt(run_id=run.id)

    assert [(s["step_id"], s["status"]) for s in receipt["steps"]] == [
        ("triage", "completed"),
        ("escalate", "skipped"),
        ("close", "completed"),
    ]
    skipped = receipt["steps"][1]
    assert skipped["when"] == {"expression": "steps.triage.output.severity == 'high'", "value": False}
    assert (skipped["attempt"], skipped["key"], skipped["kind"], skipped["executions"]) == (None, None, "llm_call", 0)
    assert (skipped["total_tokens"], skipped["cost_usd"], skipped["started_at"]) == (0, "0", None)
    assert skipped["ended_at"] is not None
    assert receipt["totals"]["attempts"] == 2  # a skipped step made no attempt
    assert receipt_consistency_problem(receipt) is None


def test_a_retried_item_has_both_attempts_under_its_step_and_the_retry_reused_the_other_items():
    run = make_run(
        steps=[
            tool_call("fan", "test_fail_before", {"succeed_on": "{{ item }}"}, for_each="{{ input.tries }}"),
        ],
        input={"tries": [1, 2, 1]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    run_retry(run_id=run.id, by="otto", reason="the tool is fixed")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    receipt = run_receipt(run_id=run.id)

    assert items_of(receipt, "fan") == [
        ("fan[0]", 1, "completed"),
        ("fan[1]", 1, "failed"),
        ("fan[1]", 2, "completed"),
        ("fan[2]", 1, "completed"),
    ]
    first, failed, second, last = entry(receipt, "fan")["items"]
    assert (failed["key"], failed["error"]["code"]) == (f"{run.id}:fan[1]:1", "test_refused")
    assert second["key"] == f"{run.id}:fan[1]:2"
    assert [(r["kind"], r["by"]) for r in first["reused"]] == [("retried", "otto")]
    assert [(r["kind"], r["by"]) for r in last["reused"]] == [("retried", "otto")]
    assert failed["reused"] == [] and second["reused"] == []
    [retry] = receipt["retries"]
    assert (retry["step_id"], retry["attempt"]) == ("fan[1]", 2)
    assert (receipt["totals"]["attempts"], receipt["totals"]["reused"]) == (5, 2)
    assert run_verify(run_id=run.id).ok


def test_an_item_that_crashed_shows_two_executions_under_one_key_and_the_redrive_reused_the_item_before_it():
    run = make_run(
        steps=[
            tool_call(
                "fan",
                "test_receipt_crash_when_asked",
                {"crash": "{{ item }}"},
                for_each="{{ input.crash }}",
                max_concurrency=1,
            )
        ],
        input={"crash": [False, True, False]},
    )
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["key"] for c in calls(run, "fan[1]")] == [f"{run.id}:fan[1]:1"] * 2

    receipt = run_receipt(run_id=run.id)

    assert items_of(receipt, "fan") == [(f"fan[{i}]", 1, "completed") for i in range(3)]
    done, crashed, later = entry(receipt, "fan")["items"]
    assert (done["executions"], crashed["executions"], later["executions"]) == (1, 2, 1)
    [redrive] = receipt["redrives"]
    assert [(r["kind"], r["seq"]) for r in done["reused"]] == [("redriven", redrive["seq"])]
    assert crashed["reused"] == [] and later["reused"] == []
    assert entry(receipt, "fan")["executions"] == 1  # the fan-out began once; its items went on after the crash
    assert receipt["totals"]["executions"] == 5
    assert run_verify(run_id=run.id).ok


def test_pal_verify_holds_for_a_fan_out_of_child_runs_and_the_signed_receipt_verifies_offline(signing_key):
    make_workflow(name="leaf", steps=[summarise("look", "Look at {{ input.t }}")])
    run = make_run(
        steps=[
            {
                "id": "sub",
                "kind": "child_run",
                "workflow": "leaf",
                "input": {"t": "{{ item }}"},
                "for_each": "{{ input.texts }}",
            },
            summarise("wrap", "Wrap up", needs=["sub"]),
        ],
        input={"texts": TEXTS[:2]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    receipt = run_receipt(run_id=run.id)

    kids = {str(k.id): k.parent_step_id for k in Run.objects.filter(parent_run_id=run.id)}
    items = entry(receipt, "sub")["items"]
    assert (
        {i["child_run_id"]: i["step_id"] for i in items}
        == kids
        == {c["run_id"]: c["parent"]["step_id"] for c in receipt["children"]}
    )
    own = entry(receipt, "wrap")
    assert receipt["totals"]["total_tokens"] == own["total_tokens"]  # the children's calls are counted in them
    assert receipt["tree_totals"]["total_tokens"] == own["total_tokens"] + sum(
        c["totals"]["total_tokens"] for c in receipt["children"]
    )
    assert receipt["tree_totals"]["runs"] == 3
    verified = run_verify(run_id=run.id)
    assert verified.ok and verified.runs == 3, verified.problem
    assert receipt_file_verify(receipt, signing_key.public_key()) is None


def test_a_receipts_sums_over_items_are_checked_offline():
    run = make_run(
        steps=[summarise("sum", "Summarise {{ item }}", for_each="{{ input.texts }}")], input={"texts": TEXTS}
    )
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    assert receipt_consistency_problem(receipt) is None

    entry(receipt, "sum")["items"][1]["prompt_tokens"] += 1

    assert receipt_consistency_problem(receipt) == f"run {run.id}: totals.prompt_tokens is not the sum over its steps"


def test_the_receipt_of_a_graph_matches_its_documented_schema_field_for_field():
    run = make_run(
        steps=[
            tool_call("triage", "echo", {"severity": "low"}),
            tool_call("escalate", "echo", {}, when="steps.triage.output.severity == 'high'"),
            summarise("sum", "Summarise {{ item }}", for_each="{{ input.texts }}", needs=["triage"]),
        ],
        input={"texts": TEXTS[:1]},
    )
    drive_to_end(run)
    receipt = run_receipt(run_id=run.id)
    ReceiptOut.model_validate(receipt)
    triage, skipped, fan = receipt["steps"]
    assert set(triage) == set(ReceiptStepOut.model_fields)
    assert set(skipped) == set(ReceiptSkippedStepOut.model_fields)
    assert set(fan) == set(ReceiptForEachStepOut.model_fields)
    assert set(fan["items"][0]) == set(ReceiptItemOut.model_fields)
    assert [s["step_id"] for s in attempts_of(receipt["steps"])] == ["triage", "escalate", "sum", "sum[0]"]

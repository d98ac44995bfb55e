"""The re-drive preview of a graph (issue 12): per item of a for_each step what is reused and what runs again (a
failed item at its next attempt, one started without an outcome under the same key), skipped steps reused, and
the tokens and cost saved counting each item once. Read through the API too, whose schema must keep all of it."""

import pytest

from runs.receipts import run_receipt
from runs.selectors import redrive_preview
from runs.services import run_retry
from runs.steps.tools import tool
from tests.api.conftest import Api, make_user, token_for
from tests.helpers import (
    Crash,
    _first_time,
    _record,
    calls,
    drive,
    drive_to_end,
    make_run,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db


@tool("test_preview_crash_when_asked")
def crash_when_asked(args, ctx):
    """Dies (the 'process' crashes) the first time it runs with {"crash": true}; returns its args otherwise."""
    _record(args, ctx)
    if args.get("crash") and _first_time(ctx):
        raise Crash(f"crash in {ctx.step_id}")
    return args


@pytest.fixture
def viewer(db):
    return Api(token_for(make_user("vera", "runs.view_run")))


def summarise(step_id: str, prompt: str, **extra) -> dict:
    return {"id": step_id, "kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake", "prompt": prompt, **extra}


def lines(entries) -> list[tuple]:
    return [(e["step_id"], e["attempt"], e.get("resumes")) for e in entries]


def test_a_fan_out_that_crashed_in_an_item_reuses_the_done_items_resumes_that_one_and_runs_the_rest(viewer):
    run = make_run(
        steps=[
            tool_step(
                "fan",
                "test_preview_crash_when_asked",
                {"crash": "{{ item }}"},
                for_each="{{ input.crash }}",
                max_concurrency=1,
            ),
            tool_step("after", "echo", {"all": "{{ steps.fan.output }}"}),
        ],
        input={"crash": [False, True, False]},
    )
    with pytest.raises(Crash):
        drive(run)

    preview = viewer.get(f"/runs/{run.id}/redrive/preview").json()

    [done] = preview["reused"]
    assert (done["step_id"], done["attempt"], done["item_of"], done["index"]) == ("fan[0]", 1, "fan", 0)
    assert lines(preview["rerun"]) == [("fan", 1, True), ("fan[1]", 1, True), ("fan[2]", 1, False), ("after", 1, False)]
    fan, crashed, waiting, after = preview["rerun"]
    assert (fan["items"], fan["item_of"]) == (3, None)
    assert (crashed["item_of"], crashed["index"], waiting["index"]) == ("fan", 1, 2)
    assert after["item_of"] is None and after["items"] is None

    sweep_after_expiry(run)
    drive_to_end(run)  # what the preview said is what the re-drive did
    assert [(c["step_id"], c["key"], c["resumed"]) for c in calls(run)] == [
        ("fan[0]", f"{run.id}:fan[0]:1", False),
        ("fan[1]", f"{run.id}:fan[1]:1", False),
        ("fan[1]", f"{run.id}:fan[1]:1", True),
        ("fan[2]", f"{run.id}:fan[2]:1", False),
    ]


def test_the_tokens_saved_count_each_item_once_and_not_the_list_of_their_outputs_again():
    run = make_run(
        steps=[
            summarise("sum", "Summarise {{ item }}", for_each="{{ input.texts }}"),
            tool_step("crash", "test_crash_once", {}, needs=["sum"]),
        ],
        input={"texts": ["alpha beta", "gamma delta epsilon"]},
    )
    with pytest.raises(Crash):
        drive(run)

    preview = redrive_preview(run)

    assert [(e["step_id"], e.get("items"), e.get("item_of")) for e in preview["reused"]] == [
        ("sum", 2, None),
        ("sum[0]", None, "sum"),
        ("sum[1]", None, "sum"),
    ]
    fan, first, second = preview["reused"]
    assert (fan["prompt_tokens"], fan["completion_tokens"], fan["cost_usd"]) == (0, 0, 0.0)
    assert first["prompt_tokens"] > 0 and second["prompt_tokens"] > 0 and first["cost_usd"] > 0
    receipt = run_receipt(run_id=run.id)  # the same calls, as the receipt counts them
    assert preview["saved"]["prompt_tokens"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert preview["saved"]["prompt_tokens"] == receipt["totals"]["prompt_tokens"]
    assert preview["saved"]["completion_tokens"] == receipt["totals"]["completion_tokens"]
    assert lines(preview["rerun"]) == [("crash", 1, True)]


def test_after_a_retry_only_the_failed_item_runs_again_at_its_next_attempt(viewer):
    run = make_run(
        steps=[tool_step("fan", "test_fail_before", {"succeed_on": "{{ item }}"}, for_each="{{ input.tries }}")],
        input={"tries": [1, 2, 1]},
    )
    drive_to_end(run)
    run_retry(run_id=run.id, by="otto", reason="the tool is fixed")

    preview = viewer.get(f"/runs/{run.id}/redrive/preview").json()

    assert [(e["step_id"], e["attempt"]) for e in preview["reused"]] == [("fan[0]", 1), ("fan[2]", 1)]
    assert lines(preview["rerun"]) == [("fan", 1, True), ("fan[1]", 2, False)]


def test_a_failed_item_with_attempts_left_is_shown_at_its_next_attempt():
    run = make_run(
        steps=[
            tool_step(
                "fan",
                "test_fail_before",
                {"succeed_on": "{{ item }}"},
                for_each="{{ input.tries }}",
                retry={"max_attempts": 3, "backoff_seconds": 60},
            )
        ],
        input={"tries": [1, 3]},
    )
    drive(run)  # fan[1] failed its first attempt; the run backs off before the next one
    assert run.status not in ("succeeded", "failed")

    preview = redrive_preview(run)

    assert [e["step_id"] for e in preview["reused"]] == ["fan[0]"]
    assert lines(preview["rerun"]) == [("fan", 1, True), ("fan[1]", 2, False)]


def test_a_skipped_step_is_reused_and_its_when_not_evaluated_again(viewer):
    run = make_run(
        steps=[
            tool_step("triage", "echo", {"severity": "low"}),
            tool_step("escalate", "echo", {}, when="steps.triage.output.severity == 'high'"),
            tool_step("crash", "test_crash_once", {}),
        ]
    )
    with pytest.raises(Crash):
        drive(run)

    preview = viewer.get(f"/runs/{run.id}/redrive/preview").json()

    assert [(e["step_id"], e["attempt"], e["skipped"]) for e in preview["reused"]] == [
        ("triage", 1, False),
        ("escalate", None, True),
    ]
    assert lines(preview["rerun"]) == [("crash", 1, True)]


def test_the_redrive_page_of_a_graph_names_the_items_and_the_skipped_step():
    from django.test import Client

    from tests.pages.conftest import logged_in
    from tests.pages.conftest import make_user as page_user

    run = make_run(
        steps=[
            tool_step("triage", "echo", {"severity": "low"}),
            tool_step("escalate", "echo", {}, when="steps.triage.output.severity == 'high'"),
            tool_step(
                "fan",
                "test_preview_crash_when_asked",
                {"crash": "{{ item }}"},
                for_each="{{ input.crash }}",
                max_concurrency=1,
            ),
        ],
        input={"crash": [False, True]},
    )
    with pytest.raises(Crash):
        drive(run)
    operator: Client = logged_in(page_user("otto", "runs.view_run", "runs.operate"))

    text = operator.get(f"/runs/{run.id}/redrive/").content.decode()

    assert "skipped: its when was false" in text and "None" not in text
    assert '<td class="mono">fan[0]</td>' in text and '<td class="mono">fan[1]</td>' in text

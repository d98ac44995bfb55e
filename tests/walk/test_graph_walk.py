"""The walk over a graph (issue 12): ready steps run at the same time, `when` skips, for_each items with their own
keys and attempts, waits on one branch, a crash inside a graph. Driven inline, as a worker would drive it."""

import pytest

from runs.errors import StepError
from runs.models import RunStatus
from runs.services import approval_decide, run_retry
from runs.steps.tools import tool
from tests.helpers import (
    Crash,
    _first_time,
    _record,
    calls,
    drive,
    drive_to_end,
    events,
    make_run,
    step_events,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db


@tool("test_fail_if_asked_once")
def fail_if_asked_once(args, ctx):
    """Fails definitely the first time it runs with {"fail": true}; returns its args otherwise."""
    _record(args, ctx)
    if args.get("fail") and _first_time(ctx):
        raise StepError("asked to fail", code="test_refused")
    return args


def nap(step_id: str, seconds: float = 0.2, **extra) -> dict:
    return tool_step(step_id, "sleep", {"seconds": seconds}, **extra)


def journal(run) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in events(run) if e.kind.startswith("step_")]


def most_at_once(run, prefix: str = "") -> int:
    """The most attempts that were started and had no outcome yet at one point of the journal."""
    open_, most = set(), 0
    for e in events(run):
        if not (e.step_id or "").startswith(prefix):
            continue
        if e.kind == "step_started":
            open_.add(e.step_id)
        elif e.kind in ("step_completed", "step_failed", "run_waiting"):
            open_.discard(e.step_id)
        most = max(most, len(open_))
    return most


def test_independent_steps_all_start_before_any_of_them_ends():
    run = make_run(steps=[nap(f"n{i}", needs=[]) for i in range(4)])

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    kinds = [kind for kind, _ in journal(run)]
    assert kinds[:4] == ["step_started"] * 4 and sorted(kinds[4:]) == ["step_completed"] * 4
    assert most_at_once(run) == 4


def test_a_diamond_runs_the_middle_together_and_the_end_after_both():
    run = make_run(
        steps=[
            tool_step("top", "echo", {"n": 1}),
            tool_step("left", "echo", {"from": "{{ steps.top.output.n }}"}, needs=["top"]),
            nap("right", needs=["top"]),
            tool_step(
                "bottom",
                "echo",
                {"l": "{{ steps.left.output }}", "r": "{{ steps.right.output }}"},
                needs=["left", "right"],
            ),
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    seq = {(kind, step): i for i, (kind, step) in enumerate(journal(run))}
    assert seq[("step_completed", "top")] < min(seq[("step_started", "left")], seq[("step_started", "right")])
    assert seq[("step_started", "bottom")] > max(seq[("step_completed", "left")], seq[("step_completed", "right")])
    assert run.output == {"l": {"from": 1}, "r": {"slept": 0.2}}


def test_a_step_whose_when_is_false_is_skipped_with_the_value_that_decided_and_its_dependents_still_run():
    run = make_run(
        steps=[
            tool_step("triage", "echo", {"severity": "low"}),
            tool_step("escalate", "test_count", {}, when="steps.triage.output.severity == 'high'"),
            tool_step("close", "echo", {"escalated": "{{ steps.escalate.output }}"}),
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    (skipped,) = step_events(run, "step_skipped")
    assert (skipped.step_id, skipped.payload["value"]) == ("escalate", False)
    assert calls(run, "escalate") == []
    assert run.output == {"escalated": None}


def test_for_each_runs_every_item_under_its_own_key_at_most_max_concurrency_at_once_and_keeps_their_order():
    seconds = [0.3, 0.1, 0.2, 0.0, 0.1]  # a later item often ends first
    run = make_run(
        steps=[tool_step("fan", "sleep", {"seconds": "{{ item }}"}, for_each="{{ input.items }}", max_concurrency=2)],
        input={"items": seconds},
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    started = step_events(run, "step_started")
    keys = {e.step_id: e.payload["key"] for e in started if e.step_id != "fan"}
    assert keys == {f"fan[{i}]": f"{run.id}:fan[{i}]:1" for i in range(5)}
    assert run.output == [{"slept": s} for s in seconds]
    assert most_at_once(run, "fan[") == 2


def test_an_item_that_fails_fails_the_run_and_a_retry_runs_only_that_item_again():
    run = make_run(
        steps=[
            tool_step(
                "fan",
                "test_fail_if_asked_once",
                {"fail": "{{ item.fail }}", "i": "{{ index }}"},
                for_each="{{ input.items }}",
            ),
        ],
        input={"items": [{"fail": False}, {"fail": True}, {"fail": False}]},
    )

    drive_to_end(run)

    assert run.status == RunStatus.FAILED
    assert (run.error["step_id"], run.error["code"]) == ("fan[1]", "test_refused")
    before = {c["step_id"] for c in calls(run)}
    assert before == {"fan[0]", "fan[1]", "fan[2]"}

    run_retry(run_id=run.id, by="otto", reason="try the item again")
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    again = [c for c in calls(run)][3:]
    assert [(c["step_id"], c["attempt"], c["key"]) for c in again] == [("fan[1]", 2, f"{run.id}:fan[1]:2")]
    assert run.output == [{"fail": False, "i": 0}, {"fail": True, "i": 1}, {"fail": False, "i": 2}]


def test_an_approval_on_one_branch_parks_only_that_branch_and_the_run_waits_when_nothing_else_can_move():
    run = make_run(
        steps=[
            {"id": "ok", "kind": "approval", "prompt": "go?", "needs": []},
            tool_step("work", "test_count", {"w": 1}, needs=[]),
            tool_step("more", "test_count", {"w": 2}, needs=["work"]),
            tool_step("end", "echo", {"done": True}, needs=["ok", "more"]),
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.WAITING
    assert (run.waiting_on["kind"], run.waiting_on["step_id"]) == ("approval", "ok")
    assert [c["step_id"] for c in calls(run)] == ["work", "more"]  # the other branch went on

    approval_decide(run_id=run.id, step_id="ok", approved=True, by="otto")
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(run)] == ["work", "more"]  # nothing ran twice
    assert run.output == {"done": True}


def test_two_approvals_on_two_branches_are_each_decided_and_the_run_goes_on_after_both():
    run = make_run(
        steps=[
            {"id": "legal", "kind": "approval", "prompt": "legal?", "needs": []},
            {"id": "money", "kind": "approval", "prompt": "money?", "needs": []},
            tool_step("end", "echo", {"done": True}, needs=["legal", "money"]),
        ]
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    assert {w["step_id"] for w in run.waiting_on["waits"]} == {"legal", "money"}

    approval_decide(run_id=run.id, step_id="money", approved=True, by="otto")  # the second of the two
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "legal"
    assert "waits" not in run.waiting_on

    approval_decide(run_id=run.id, step_id="legal", approved=True, by="vera")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert len(step_events(run, "approval_requested")) == 2  # each asked once


def test_a_crash_in_one_branch_resumes_it_under_the_same_key_and_reuses_what_the_other_branches_finished():
    run = make_run(
        steps=[
            tool_step("steady", "test_count", {"s": 1}, needs=[]),
            nap("warm", 0.2, needs=[]),
            nap("long", 1.0, needs=[]),
            tool_step("shaky", "test_crash_once", {"s": 2}, needs=["warm"]),  # crashes while `long` still runs
            tool_step(
                "end",
                "echo",
                {"a": "{{ steps.steady.output }}", "b": "{{ steps.shaky.output }}"},
                needs=["steady", "shaky", "long"],
            ),
        ]
    )
    with pytest.raises(Crash):
        drive(run)
    assert {step for kind, step in journal(run) if kind == "step_completed"} == {"steady", "warm"}
    sweep_after_expiry(run)

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    shaky = calls(run, "shaky")
    assert [c["key"] for c in shaky] == [f"{run.id}:shaky:1"] * 2 and shaky[1]["resumed"] is True
    assert len(calls(run, "steady")) == 1  # finished before the crash: reused, not run again
    resumed = [e for e in step_events(run, "step_started") if e.payload.get("resumed")]
    assert {e.step_id for e in resumed} == {"shaky", "long"}
    assert run.output == {"a": {"s": 1}, "b": {"s": 2}}


def test_an_approval_decided_while_other_branches_still_run_is_taken_when_the_walk_would_park():
    from runs.models import Run

    decided = {}

    @tool("test_decide_meanwhile")
    def decide_meanwhile(args, ctx):
        """Runs after the approval's branch parked, while the run is still running: an operator decides now."""
        if ctx.run_id not in decided:
            decided[ctx.run_id] = True
            assert Run.objects.get(id=ctx.run_id).status == RunStatus.RUNNING
            approval_decide(run_id=ctx.run_id, step_id="ok", approved=True, by="otto", comment="while it ran")
        return args

    run = make_run(
        steps=[
            {"id": "ok", "kind": "approval", "prompt": "go?", "needs": []},
            tool_step("warm", "echo", {}, needs=[]),
            tool_step("meanwhile", "test_decide_meanwhile", {"m": 1}, needs=["warm"]),
            tool_step("end", "echo", {"ok": "{{ steps.ok.output.approved }}"}, needs=["ok", "meanwhile"]),
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED  # never parked: the decision was there when it would have
    assert [e.kind for e in events(run) if e.kind in ("run_waiting", "approval_decided", "run_resumed")] == [
        "run_waiting",
        "approval_decided",
    ]
    assert run.output == {"ok": True}


def test_one_retry_runs_every_failed_item_again_and_reuses_the_others():
    run = make_run(
        steps=[
            tool_step("fan", "test_fail_if_asked_once", {"fail": "{{ item }}"}, for_each="{{ input.items }}"),
        ],
        input={"items": [False, True, False, True]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED

    run_retry(run_id=run.id, by="otto", reason="both again")
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    again = calls(run)[4:]
    assert sorted((c["step_id"], c["attempt"]) for c in again) == [("fan[1]", 2), ("fan[3]", 2)]

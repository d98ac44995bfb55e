"""An approval's timeout (issue 28): at its deadline (by the database's clock) the engine decides it as on_timeout
says, through the durable timer's wake-up, journaled approval_decided by "timeout"; a person's decision first wins."""

import time

import pytest

from runs.explain import run_why
from runs.models import RunStatus
from runs.recovery import sweep_once
from runs.services import Conflict, approval_decide, run_wake_timer
from tests.helpers import drive, drive_to_end, echo_step, kinds, make_run, step_events

pytestmark = pytest.mark.django_db

TIMEOUT = 0.3  # seconds: the tests sleep past it; nothing here measures time


def parked(**fields):
    run = make_run(
        steps=[
            {"id": "review", "kind": "approval", "prompt": "Go?", "timeout_seconds": TIMEOUT, **fields},
            echo_step("after", got="{{ steps.review.output }}"),
        ]
    )
    drive(run)
    assert run.status == RunStatus.WAITING, kinds(run)
    return run


def past_the_deadline():
    time.sleep(TIMEOUT + 0.1)


def test_the_wait_carries_its_deadline_and_a_durable_wake_time():
    run = parked()

    assert run.waiting_on["deadline"] and run.wake_at is not None
    assert run.wake_at.isoformat() == run.waiting_on["deadline"]
    assert not run_wake_timer(run_id=run.id)  # before the deadline: nothing is decided
    assert step_events(run, "approval_decided") == []


def test_at_the_deadline_it_is_rejected_by_timeout_and_the_step_fails():
    run = parked()
    past_the_deadline()

    assert run_wake_timer(run_id=run.id)
    drive_to_end(run)

    (decided,) = step_events(run, "approval_decided", "review")
    assert decided.payload["by"] == "timeout" and decided.payload["timed_out"] is True
    assert decided.payload["approved"] is False and decided.attempt == 1
    assert run.status == RunStatus.FAILED and run.error["code"] == "approval_timed_out"


def test_on_timeout_approve_goes_on():
    run = parked(on_timeout="approve")
    past_the_deadline()

    run_wake_timer(run_id=run.id)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"got": {"approved": True, "by": "timeout", "comment": f"no decision within {TIMEOUT} s"}}


def test_a_default_answer_is_the_output_as_a_persons_answer_would_be():
    form = {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}
    run = parked(form=form, choices=["refund", "hold"], on_timeout={"choice": "hold", "amount": 0})
    past_the_deadline()

    run_wake_timer(run_id=run.id)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"got": {"amount": 0, "choice": "hold"}}


def test_the_sweep_decides_an_overdue_approval_whose_wake_up_was_lost():
    run = parked()
    past_the_deadline()

    sweep = sweep_once(who="test")

    assert str(run.id) in sweep.woken
    assert step_events(run, "approval_decided", "review")[0].payload["by"] == "timeout"


def test_a_persons_decision_before_the_deadline_wins_and_the_timer_decides_nothing():
    run = parked()
    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")
    past_the_deadline()

    assert not run_wake_timer(run_id=run.id)
    drive_to_end(run)

    assert [e.payload["by"] for e in step_events(run, "approval_decided")] == ["alice"]
    assert run.status == RunStatus.SUCCEEDED


def test_after_the_timeout_a_person_is_told_who_decided():
    run = parked()
    past_the_deadline()
    run_wake_timer(run_id=run.id)

    with pytest.raises(Conflict) as late:
        approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")

    assert "decided already, rejected by timeout" in late.value.detail


def test_a_deadline_reached_while_other_branches_run_is_decided_once_the_run_parks():
    run = make_run(
        steps=[
            {"id": "review", "kind": "approval", "prompt": "Go?", "timeout_seconds": TIMEOUT, "needs": []},
            {"id": "slow", "kind": "tool_call", "tool": "sleep", "args": {"seconds": TIMEOUT + 0.2}, "needs": []},
        ]
    )

    drive(run)  # the approval parks its branch; the sleep outlives the deadline; then the run parks

    assert run.status == RunStatus.WAITING
    assert run_wake_timer(run_id=run.id)  # due already: decided at once
    drive_to_end(run)
    assert step_events(run, "approval_decided", "review")[0].payload["by"] == "timeout"


def test_why_names_the_assignee_and_what_the_engine_does_at_the_deadline():
    run = parked(assign={"group": "billing"}, on_timeout="approve")

    why = run_why(run)

    assert "the approval of step 'review' (assigned to group billing)" in why
    assert f"approved by the engine at {run.waiting_on['deadline'][:19]}" in why

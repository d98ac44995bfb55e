"""The executor's part of issue 10: an unknown outcome never makes a new attempt, a database error under a step is
not the step's failure, a child driven inline slices with its root, and the replay reads only what it needs."""

import pytest
from django.db import OperationalError

from journal.selectors import replay_rows_for_run
from runs.errors import StepError
from runs.models import Run, RunLock, RunStatus
from runs.services import run_retry, workflow_create
from runs.steps.tools import tool
from tests.helpers import (
    _first_time,
    _record,
    calls,
    drive,
    drive_to_end,
    echo_step,
    kinds,
    make_run,
    step_events,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db


@tool("test_always_unknown")
def always_unknown_tool(args, ctx):
    """Every call's outcome is unknown: the connection drops after sending."""
    _record(args, ctx)
    raise StepError("connection lost after sending", permanent=False, code="test_unavailable")


@tool("test_database_blip_once")
def database_blip_once_tool(args, ctx):
    """The first call meets a database error (our store went away under the step); then it works."""
    _record(args, ctx)
    if _first_time(ctx):
        raise OperationalError("the connection is closed")
    return args


def test_an_unknown_outcome_past_its_retries_is_tried_again_under_the_same_attempt_and_key(settings):
    settings.PAL_UNKNOWN_RETRIES = 0
    run = make_run(steps=[tool_step("a", "test_always_unknown", retry={"max_attempts": 3})])
    drive_to_end(run)

    assert run.status == RunStatus.FAILED
    assert [c["key"] for c in calls(run)] == [f"{run.id}:a:1"] * 3  # max_attempts tries, never a new attempt
    assert [e.attempt for e in step_events(run, "step_failed", "a")] == [1, 1, 1]
    assert all(e.payload["permanent"] is False for e in step_events(run, "step_failed", "a"))
    assert [e.payload.get("resumed") for e in step_events(run, "step_started", "a")] == [None, True, True]
    assert run.error["attempt"] == 1


def test_an_operators_retry_of_an_unknown_outcome_sends_it_again_under_the_same_key(settings):
    settings.PAL_UNKNOWN_RETRIES = 0
    run = make_run(steps=[tool_step("a", "test_always_unknown")])
    drive_to_end(run)
    assert run.status == RunStatus.FAILED

    run_retry(run_id=run.id, by="otto", reason="the peer is back")
    (retried,) = step_events(run, "run_retried", "a")
    assert retried.attempt == 1
    drive_to_end(run)

    assert [c["key"] for c in calls(run)] == [f"{run.id}:a:1", f"{run.id}:a:1"]


def test_a_definite_failure_still_goes_on_with_the_next_attempt():
    run = make_run(steps=[tool_step("a", "test_fail_before", {"succeed_on": 2}, retry={"max_attempts": 2})])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["key"] for c in calls(run)] == [f"{run.id}:a:1", f"{run.id}:a:2"]


def test_a_database_error_inside_a_step_stops_the_walk_without_a_step_failed_and_the_sweep_finishes_it():
    run = make_run(steps=[tool_step("a", "test_database_blip_once"), echo_step("b")])

    assert drive(run) == "interrupted"
    assert run.status == RunStatus.RUNNING
    assert "step_failed" not in kinds(run) and "run_failed" not in kinds(run)
    assert RunLock.objects.filter(run_id=run.id).exists()  # left to expire: the sweep takes it from there

    sweep_after_expiry(run)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["key"] for c in calls(run, "a")] == [f"{run.id}:a:1", f"{run.id}:a:1"]  # the same attempt again


def test_a_child_driven_inline_hands_the_whole_tree_back_at_the_end_of_its_roots_slice(settings):
    settings.PAL_SLICE_SECONDS = 1e-9
    workflow_create(
        definition={
            "name": "long-child",
            "steps": [tool_step("c1", "test_count"), tool_step("c2", "test_count"), tool_step("c3", "test_count")],
        }
    )
    parent = make_run(
        steps=[{"id": "sub", "kind": "child_run", "workflow": "long-child", "input": {}}, echo_step("after")]
    )

    drives = drive_to_end(parent)

    assert parent.status == RunStatus.SUCCEEDED
    assert drives > 2  # the child's steps did not all run in the parent's first slice
    (child,) = Run.objects.filter(parent_run_id=parent.id)
    assert child.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(child)] == ["c1", "c2", "c3"]  # each child step ran once
    assert [e.step_id for e in step_events(child, "step_started")] == ["c1", "c2", "c3"]
    assert step_events(parent, "child_sliced", "sub")
    assert step_events(parent, "child_adopted") == []  # a slice is not a crash: nothing to adopt
    assert len(step_events(parent, "step_started", "sub")) == 1
    assert not RunLock.objects.filter(run_id__in=[parent.id, child.id]).exists()


def test_the_replay_reads_outcomes_but_not_the_payload_of_step_started():
    run = make_run(steps=[echo_step("a", big="x" * 10_000), echo_step("b")])
    drive_to_end(run)

    rows = replay_rows_for_run(run_id=run.id)
    by_kind = {kind: payload for _seq, kind, _step, _attempt, payload, _at, _hash in rows if kind != "run_created"}
    assert by_kind["step_started"] is None and by_kind["run_succeeded"] is None
    assert by_kind["step_completed"]["output"] == {"done": True} or "output" in by_kind["step_completed"]


def test_a_parent_parked_on_a_child_that_ended_without_waking_it_is_stuck_and_the_sweep_moves_it():
    from runs.explain import run_why
    from runs.recovery import parents_of_moved_children, sweep_once

    workflow_create(definition={"name": "asks", "steps": [{"id": "ok", "kind": "approval", "prompt": "go?"}]})
    parent = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "asks", "input": {}}, echo_step("after")])
    drive(parent)
    (child,) = Run.objects.filter(parent_run_id=parent.id)
    assert parent.status == RunStatus.WAITING and child.status == RunStatus.WAITING
    assert parents_of_moved_children() == []  # the child still waits: the parent is not stuck

    # The child ended and the wake-up of its parent was lost (say, a crash between the two).
    Run.objects.filter(id=child.id).update(status=RunStatus.SUCCEEDED, output={"approved": True})

    assert parents_of_moved_children() == [(parent.id, child.id, RunStatus.SUCCEEDED, True)]
    assert "that child is succeeded and nothing drives it, so this run is stuck" in run_why(parent)
    assert str(parent.id) in sweep_once().woken
    drive_to_end(parent)
    assert parent.status == RunStatus.SUCCEEDED
    assert step_events(parent, "step_completed", "sub")[0].payload["output"] == {"approved": True}

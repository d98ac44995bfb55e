"""child_run: the parent's step creates a child run and drives it inline (issue 3, docs/reference/keys.md).

Runs are driven inline in the test process with runs.walk.run_drive (tests.helpers.drive). A crash is
tests.helpers' Crash, a BaseException the executor does not catch: it stands for the process dying mid-step.
"""

import json
import uuid

import pytest
from django.db import connection

from runs import leases
from runs.models import FINAL_STATUSES, Run, RunLock, RunStatus
from runs.recovery import stuck_run_ids, sweep_once
from runs.services import run_cancel
from runs.steps.tools import tool
from tests.helpers import (
    Crash,
    drive,
    echo_step,
    events,
    kinds,
    make_run,
    make_workflow,
    record_drive_sends,
    step_events,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db

_crashed_at_depth: set[str] = set()  # workflow names whose crash at the chosen depth already happened


@tool("child_test_crash_at_depth")
def crash_at_depth_tool(args, ctx):
    """Kills the 'process' once, in the run of this workflow that sits at depth args["depth"]."""
    run = Run.objects.select_related("workflow").get(id=ctx.run_id)
    if run.depth == args["depth"] and run.workflow.name not in _crashed_at_depth:
        _crashed_at_depth.add(run.workflow.name)
        raise Crash(f"crash at depth {run.depth}")
    return args


@tool("child_test_cancel_parent")
def cancel_parent_tool(args, ctx):
    """An operator cancels this run's parent while this (child) step runs."""
    child = Run.objects.get(id=ctx.run_id)
    run_cancel(run_id=child.parent_run_id, by="alice", reason="stop the tree")
    return args


@pytest.fixture(autouse=True)
def quiet_heartbeat(monkeypatch):
    """The heartbeat thread has its own connection, which cannot see this test's uncommitted lease rows: left
    alone it would find every lease gone at its next beat. Here it reports every held lease as still held."""
    monkeypatch.setattr(leases, "lease_heartbeat", lambda owner=None: [str(r) for r in list(leases.heartbeat._held)])


def child_step(step_id: str, workflow: str, input: dict | None = None) -> dict:
    step = {"id": step_id, "kind": "child_run", "workflow": workflow}
    if input is not None:
        step["input"] = input
    return step


def parent_of(child_workflow, *, input=None) -> Run:
    """A run whose only step, "sub", runs the child workflow with {"q": input.q}."""
    return make_run(steps=[child_step("sub", child_workflow.name, {"q": "{{ input.q }}"})], input=input or {"q": "why"})


def children(run) -> list[Run]:
    return list(Run.objects.filter(parent_run_id=run.id))


def recursive_workflow(*first_steps):
    """A workflow whose last step runs the workflow itself."""
    name = f"rec-{uuid.uuid4().hex[:10]}"
    return make_workflow(name=name, steps=[*first_steps, child_step("again", name)])


def runs_by_depth(workflow) -> dict[int, list[Run]]:
    found: dict[int, list[Run]] = {}
    for run in Run.objects.filter(workflow__name=workflow.name).order_by("depth"):
        found.setdefault(run.depth, []).append(run)
    return found


def depth_from_chain(run) -> int:
    depth = 0
    while run.parent_run_id is not None:
        run = Run.objects.get(id=run.parent_run_id)
        depth += 1
    return depth


def crashed_while_driving_the_child():
    """A parent whose process died inside its child's first step: the child row exists, the parent's step has
    step_started and child_created but no outcome. Returns (parent, child)."""
    child_wf = make_workflow(
        steps=[tool_step("first", "test_crash_once", {"n": 1}), echo_step("last", answer="{{ input.q }}")]
    )
    parent = parent_of(child_wf)
    with pytest.raises(Crash, match="crash in first"):
        drive(parent)
    parent.refresh_from_db()
    (child,) = children(parent)
    assert [e.kind for e in events(parent) if e.step_id == "sub"] == ["step_started", "child_created"]
    return parent, child


# --- output and failure ---------------------------------------------------------------------------


def test_the_childs_output_becomes_the_parent_steps_output():
    child_wf = make_workflow(steps=[echo_step("answer", said="{{ input.q }}", n=42)])
    parent = parent_of(child_wf, input={"q": "why"})

    drive(parent)

    (child,) = children(parent)
    assert child.status == RunStatus.SUCCEEDED
    assert child.output == {"said": "why", "n": 42}
    assert step_events(parent, "step_completed", "sub")[0].payload["output"] == {"said": "why", "n": 42}
    assert parent.status == RunStatus.SUCCEEDED
    assert parent.output == {"said": "why", "n": 42}


def test_the_step_completed_payload_carries_the_child_run_id():
    parent = parent_of(make_workflow(steps=[echo_step("answer", ok=True)]))

    drive(parent)

    (child,) = children(parent)
    assert step_events(parent, "step_completed", "sub")[0].payload["child_run_id"] == str(child.id)


def test_the_child_is_created_with_the_rendered_input_of_the_step():
    parent = parent_of(make_workflow(steps=[echo_step("answer", ok=True)]), input={"q": "the question"})

    drive(parent)

    (child,) = children(parent)
    assert child.input == {"q": "the question"}


def test_a_failed_child_fails_the_parent_step_with_the_childs_error_and_id():
    child_wf = make_workflow(steps=[tool_step("refuse", "test_fail")])
    parent = parent_of(child_wf)

    drive(parent)

    (child,) = children(parent)
    assert child.status == RunStatus.FAILED
    assert child.error["code"] == "test_refused"
    failed = step_events(parent, "step_failed", "sub")[0].payload
    assert failed["code"] == "child_failed"
    assert str(child.id) in failed["message"] and "the test tool refuses" in failed["message"]
    assert failed["details"] == {
        "child_run_id": str(child.id),
        "error": {"code": "test_refused", "message": "the test tool refuses", "step_id": "refuse"},
    }
    assert parent.status == RunStatus.FAILED
    assert parent.error["step_id"] == "sub"
    assert parent.error["code"] == "child_failed"
    assert parent.error["details"]["child_run_id"] == str(child.id)


def test_a_child_of_a_workflow_that_does_not_exist_fails_the_step_and_creates_nothing():
    parent = make_run(steps=[child_step("sub", "no-such-workflow")])

    drive(parent)

    assert children(parent) == []
    failed = step_events(parent, "step_failed", "sub")[0].payload
    assert failed["code"] == "workflow_not_found"
    assert "no-such-workflow" in failed["message"]
    assert parent.status == RunStatus.FAILED


# --- how a child is created -----------------------------------------------------------------------


def test_the_parents_journal_records_child_created_with_the_childs_id_and_depth():
    child_wf = make_workflow(steps=[echo_step("answer", ok=True)])
    parent = parent_of(child_wf)

    drive(parent)

    (child,) = children(parent)
    (created,) = step_events(parent, "child_created", "sub")
    assert created.attempt == 1
    assert created.payload == {
        "child_run_id": str(child.id),
        "workflow": child_wf.name,
        "version": child_wf.version,
        "depth": 1,
    }
    assert [e.kind for e in events(parent) if e.step_id == "sub"] == ["step_started", "child_created", "step_completed"]


def test_a_child_row_is_inserted_running_never_queued_and_no_drive_task_is_sent_for_it(monkeypatch):
    inserted = []

    def on_execute(execute, sql, params, many, context):
        # Runs are inserted in bulk (runs.services.ingest._runs_insert: no post_save): read the rows off the
        # INSERT, on Postgres the first part of the one statement that also writes the journal (_statement_of).
        head = 'INSERT INTO "runs" ('
        if sql.startswith((head, "WITH part0 AS (" + head)):
            columns = [name.strip(' "') for name in sql.split(head, 1)[1].split(")", 1)[0].split(",")]
            if "jsonb_to_recordset" in sql:  # Postgres: one JSON text of records (pal.rows.Insert)
                rows = json.loads(params[0])
            else:  # bulk_create's VALUES
                rows = [
                    dict(zip(columns, params[i : i + len(columns)], strict=True))
                    for i in range(0, len(params), len(columns))
                ]
            for row in rows:
                if row["parent_run_id"] is not None:
                    inserted.append((uuid.UUID(str(row["id"])), row["status"], row["started_at"] is not None))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(on_execute):
        sent = record_drive_sends(monkeypatch)
        _parent, child = crashed_while_driving_the_child()

    assert inserted == [(child.id, RunStatus.RUNNING, True)]
    assert kinds(child) == ["run_created", "run_started", "step_started"]  # no second run_started from a queue
    assert str(child.id) not in {s["run_id"] for s in sent}
    # Its lease, if any, is the driving worker's own, never a booking for a task.
    assert not RunLock.objects.filter(run_id=child.id, owner__startswith="task:").exists()


def test_a_child_records_its_parent_step_and_attempt_in_trigger_meta_and_columns():
    parent, child = crashed_while_driving_the_child()

    assert child.trigger_meta == {"parent_run_id": str(parent.id), "parent_step_id": "sub", "attempt": 1}
    assert (child.parent_run_id, child.parent_step_id, child.parent_attempt, child.depth) == (parent.id, "sub", 1, 1)


# --- adoption after a crash -----------------------------------------------------------------------


def test_a_redrive_adopts_the_child_of_the_interrupted_attempt_instead_of_creating_a_second():
    parent, child = crashed_while_driving_the_child()
    sweep_after_expiry(parent)

    drive(parent)

    assert [c.id for c in children(parent)] == [child.id]
    (adopted,) = step_events(parent, "child_adopted", "sub")
    assert adopted.attempt == 1
    assert adopted.payload == {"child_run_id": str(child.id), "status": "running"}
    assert len(step_events(parent, "child_created", "sub")) == 1


def test_an_adopted_child_continues_where_it_stopped_and_its_output_becomes_the_parents():
    parent, child = crashed_while_driving_the_child()
    sweep_after_expiry(parent)

    drive(parent)

    child.refresh_from_db()
    assert child.status == RunStatus.SUCCEEDED
    assert [(e.kind, e.payload.get("resumed")) for e in events(child) if e.step_id == "first"] == [
        ("step_started", None),
        ("step_started", True),
        ("step_completed", None),
    ]
    assert parent.status == RunStatus.SUCCEEDED
    assert parent.output == child.output == {"answer": "why"}
    assert step_events(parent, "step_completed", "sub")[0].payload["child_run_id"] == str(child.id)


def test_a_child_that_ended_before_the_crash_is_adopted_and_its_output_reused_without_driving_it_again(monkeypatch):
    import runs.walk.writer  # the walk's rows go through its JournalWriter

    child_wf = make_workflow(steps=[echo_step("answer", ok=True)])
    parent = parent_of(child_wf)
    real_append = runs.walk.writer.events_append

    def dies_before_the_parents_step_completed(*, run_id, events, **kw):
        if str(run_id) == str(parent.id) and any(e.kind == "step_completed" for e in events):
            raise Crash("died after the child ended, before the parent's step_completed")
        return real_append(run_id=run_id, events=events, **kw)

    monkeypatch.setattr(runs.walk.writer, "events_append", dies_before_the_parents_step_completed)
    with pytest.raises(Crash):
        drive(parent)
    monkeypatch.setattr(runs.walk.writer, "events_append", real_append)
    (child,) = children(parent)
    child.refresh_from_db()
    assert child.status == RunStatus.SUCCEEDED
    assert step_events(parent, "step_completed", "sub") == []
    child_events = len(events(child))
    sweep_after_expiry(parent)

    drive(parent)

    assert [c.id for c in children(parent)] == [child.id]
    assert step_events(parent, "child_adopted", "sub")[0].payload == {
        "child_run_id": str(child.id),
        "status": "succeeded",
    }
    assert parent.status == RunStatus.SUCCEEDED
    assert parent.output == {"ok": True}
    assert len(events(child)) == child_events  # not walked again


# --- depth ----------------------------------------------------------------------------------------


def test_a_self_recursive_workflow_ends_failed_with_exactly_one_run_at_each_depth_up_to_five(settings):
    assert settings.PAL_MAX_CHILD_DEPTH == 5
    workflow = recursive_workflow(echo_step("here", ok=True))
    root = make_run(workflow=workflow)

    drive(root)

    by_depth = runs_by_depth(workflow)
    assert {depth: len(runs) for depth, runs in by_depth.items()} == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert all(run.status == RunStatus.FAILED for runs in by_depth.values() for run in runs)
    assert root.status == RunStatus.FAILED


def test_the_depth_limit_failure_names_the_limit():
    workflow = recursive_workflow()
    root = make_run(workflow=workflow)

    drive(root)

    (deepest,) = runs_by_depth(workflow)[5]
    assert deepest.error["code"] == "max_child_depth"
    assert "PAL_MAX_CHILD_DEPTH=5" in deepest.error["message"]
    assert step_events(deepest, "child_created") == []
    assert "PAL_MAX_CHILD_DEPTH=5" in root.error["message"]  # the root's error carries the cause up


def test_each_runs_depth_is_the_length_of_its_parent_chain():
    workflow = recursive_workflow()
    root = make_run(workflow=workflow)

    drive(root)

    for run in Run.objects.filter(workflow__name=workflow.name):
        assert run.depth == depth_from_chain(run)
        assert run.trigger_meta.get("parent_run_id") == (str(run.parent_run_id) if run.parent_run_id else None)


def test_a_lower_max_child_depth_caps_the_tree_at_that_depth(settings):
    settings.PAL_MAX_CHILD_DEPTH = 2
    workflow = recursive_workflow()
    root = make_run(workflow=workflow)

    drive(root)

    by_depth = runs_by_depth(workflow)
    assert {depth: len(runs) for depth, runs in by_depth.items()} == {0: 1, 1: 1, 2: 1}
    assert by_depth[2][0].error["code"] == "max_child_depth"
    assert "PAL_MAX_CHILD_DEPTH=2" in by_depth[2][0].error["message"]


def test_depth_is_still_right_after_a_crash_in_the_middle_of_the_tree_and_a_replay():
    workflow = recursive_workflow(tool_step("maybe", "child_test_crash_at_depth", {"depth": 2}))
    root = make_run(workflow=workflow)
    with pytest.raises(Crash, match="crash at depth 2"):
        drive(root)
    assert sorted(runs_by_depth(workflow)) == [0, 1, 2]
    sweep_after_expiry(root)

    drive(root)  # replays the root, adopts depth 1, which adopts depth 2, which goes on creating 3, 4, 5

    by_depth = runs_by_depth(workflow)
    assert {depth: len(runs) for depth, runs in by_depth.items()} == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    for run in Run.objects.filter(workflow__name=workflow.name):
        assert run.depth == depth_from_chain(run)
    assert len(step_events(root, "child_adopted")) == 1
    assert len(step_events(by_depth[1][0], "child_adopted")) == 1
    assert by_depth[5][0].error["code"] == "max_child_depth"
    assert root.status == RunStatus.FAILED


def test_a_child_redriven_on_its_own_creates_its_own_child_one_level_deeper():
    """Depth is read from the database, not carried by the walk: a walk that starts at a child (an orphan
    re-driven by the sweep) still puts the grandchild at depth 2."""
    workflow = recursive_workflow(tool_step("maybe", "child_test_crash_at_depth", {"depth": 1}))
    root = make_run(workflow=workflow)
    with pytest.raises(Crash, match="crash at depth 1"):
        drive(root)
    (child,) = runs_by_depth(workflow)[1]
    RunLock.objects.filter(run_id=child.id).delete()
    # By hand: its parent ended (no code path does this while a child is live), so the sweep takes the child.
    Run.objects.filter(id=root.id).update(status=RunStatus.FAILED)
    sweep_after_expiry(child)

    drive(child)

    by_depth = runs_by_depth(workflow)
    assert {depth: len(runs) for depth, runs in by_depth.items()} == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert by_depth[2][0].parent_run_id == child.id
    assert by_depth[5][0].error["code"] == "max_child_depth"


# --- no split brain: the sweep ------------------------------------------------------------------------


def test_the_sweep_does_not_pick_a_child_without_a_lease_while_its_parent_is_alive():
    parent, child = crashed_while_driving_the_child()
    RunLock.objects.filter(run_id=child.id).delete()
    RunLock.objects.filter(run_id=parent.id).delete()

    stuck = stuck_run_ids()

    assert child.id not in stuck
    assert parent.id in stuck


def test_a_sweep_redrives_the_parent_of_a_stranded_child_and_not_the_child():
    parent, child = crashed_while_driving_the_child()
    RunLock.objects.filter(run_id=child.id).delete()
    RunLock.objects.filter(run_id=parent.id).delete()

    sweep = sweep_once()

    assert str(parent.id) in sweep.redriven
    assert str(child.id) not in sweep.redriven
    assert "run_redriven" not in kinds(child)
    assert not RunLock.objects.filter(run_id=child.id).exists()


def test_a_child_whose_parent_has_ended_is_swept_on_its_own():
    parent, child = crashed_while_driving_the_child()
    RunLock.objects.filter(run_id=child.id).delete()
    # By hand: the parent ended without its child (no code path does this today; an orphan must not be stranded).
    Run.objects.filter(id=parent.id).update(status=RunStatus.FAILED)

    assert child.id in stuck_run_ids()


# --- cancel -----------------------------------------------------------------------------------------


def test_cancelling_a_parent_cancels_its_unfinished_child():
    parent, child = crashed_while_driving_the_child()

    run_cancel(run_id=parent.id, by="alice", reason="no longer needed")

    child.refresh_from_db()
    assert child.status == RunStatus.CANCELLED
    assert child.finished_at is not None
    (cancelled,) = step_events(child, "run_cancelled")
    assert cancelled.payload["by"] == "alice"
    assert str(parent.id) in cancelled.payload["reason"]
    assert not RunLock.objects.filter(run_id=child.id).exists()


def test_a_child_being_driven_stops_at_its_next_step_when_its_parent_is_cancelled():
    child_wf = make_workflow(
        steps=[tool_step("cancel", "child_test_cancel_parent", {"n": 1}), tool_step("after", "test_count")]
    )
    parent = make_run(steps=[child_step("sub", child_wf.name), echo_step("never", n=2)])

    assert drive(parent) == "fenced"

    (child,) = children(parent)
    assert (parent.status, child.status) == (RunStatus.CANCELLED, RunStatus.CANCELLED)
    assert step_events(child, "step_started", "after") == []
    assert "run_succeeded" not in kinds(child)
    assert [e.kind for e in events(parent) if e.step_id in ("sub", "never")] == ["step_started", "child_created"]
    assert kinds(parent)[-1] == "run_cancelled"


def test_the_journal_of_a_successful_parent_is_in_order_and_gap_free():
    parent = parent_of(make_workflow(steps=[echo_step("answer", ok=True)]))

    drive(parent)

    (child,) = children(parent)
    for run in (parent, child):
        seqs = [e.seq for e in events(run)]
        assert seqs == list(range(1, len(seqs) + 1))
    assert [e.kind for e in events(child)] == [
        "run_created",
        "run_started",
        "step_started",
        "step_completed",
        "run_succeeded",
    ]
    assert not RunLock.objects.filter(run_id__in=[parent.id, child.id]).exists()
    assert {parent.status, child.status} <= set(FINAL_STATUSES)


def test_a_child_created_by_a_parent_is_journaled_as_driven_by_its_parent():
    parent = parent_of(make_workflow(steps=[echo_step("answer", ok=True)]))

    drive(parent)

    (child,) = children(parent)
    created, started = events(child)[:2]
    assert created.payload["parent_run_id"] == str(parent.id)
    assert created.payload["parent_step_id"] == "sub"
    assert created.payload["depth"] == 1
    assert started.payload["driven_by_parent"] is True

"""What used to escape the walk is a definite, explained failure (issue 23, section 1): a `when` that cannot be
worked out, an `output` that reads what is not there, a step's output that is not JSON, and, beyond those, a bug
of ours that repeats at the same point of a walk: it fails the run after PAL_WALK_CRASHES in a row."""

import math
import time

import pytest
from django.db import DataError, IntegrityError, OperationalError

from runs.crashes import crash_note
from runs.models import RunLock, RunStatus
from runs.services import run_create, workflow_create
from runs.steps.tools import tool
from runs.walk.scheduler import Graph
from tests.helpers import booked_task_id, drive, echo_step, kinds, make_run, step_events, sweep_after_expiry, tool_step

pytestmark = pytest.mark.django_db


class Opaque:
    """Something a tool may hand back that JSON cannot hold."""


NOT_JSON = {
    "set": ({"seen": {1, 2}}, "output.seen is a set"),
    "nan": ({"score": math.nan}, "output.score is nan, which JSON cannot hold"),
    "object": ({"rows": [1, Opaque()]}, "output.rows.1 is a Opaque"),
}


@tool("test_not_json")
def not_json_tool(args, ctx):
    return NOT_JSON[args["what"]][0]


def workflow(*steps, **options):
    return workflow_create(definition={"name": f"wf-{time.monotonic_ns()}", "steps": list(steps), **options})


@pytest.mark.parametrize("n", ["7", None], ids=["a-string", "null"])
def test_a_when_that_cannot_be_worked_out_fails_its_step_with_when_error(n):
    run = make_run(steps=[echo_step("a", n=n), {**echo_step("b"), "when": "steps.a.output.n > 5"}])

    assert drive(run) == "walked"

    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "when_error" and run.error["step_id"] == "b", run.error
    assert "steps.a.output.n > 5" in run.error["message"]
    assert [e.payload["output"] for e in step_events(run, "step_completed", "a")] == [{"n": n}]  # written, once
    assert kinds(run)[-2:] == ["step_failed", "run_failed"]
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_an_output_that_reads_a_skipped_step_fails_the_run_with_template_error():
    run = make_run(
        workflow=workflow(
            echo_step("a", n=1),
            {**echo_step("b", text="hi"), "when": "steps.a.output.n == 2"},
            output="{{ steps.b.output.text }}",
        )
    )

    assert drive(run) == "walked"

    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "template_error" and run.error["step_id"] is None, run.error
    assert "steps.b.output" in run.error["message"]
    assert kinds(run)[-3:] == ["step_completed", "step_skipped", "run_failed"]


@pytest.mark.parametrize("what", list(NOT_JSON))
def test_a_tool_whose_output_is_not_json_fails_its_step_with_internal_error(what):
    run = make_run(steps=[tool_step("a", "test_not_json", {"what": what})])

    assert drive(run) == "walked"

    assert run.status == RunStatus.FAILED
    [failed] = step_events(run, "step_failed", "a")
    assert failed.payload["code"] == "internal_error"
    assert failed.payload["message"] == f"what step a returned is not JSON: {NOT_JSON[what][1]}"
    assert run.error["code"] == "internal_error"


# --- a bug of ours ----------------------------------------------------------------------------------------


def crash_in_ready_once_a_ended(monkeypatch, *, times: int = 10**6):
    """A bug in the walk: once step a of a run with input {"bug": true} has ended, it raises, `times` times."""
    ready = Graph.ready
    crashes = []

    def buggy(self):
        if self.walk.run.input.get("bug") and "a" in self.walk.step_context and len(crashes) < times:
            crashes.append(1)
            raise KeyError("a bug in the walk")
        return ready(self)

    monkeypatch.setattr(Graph, "ready", buggy)
    return crashes


def limited(**options):
    return workflow(tool_step("a", "test_count", {"n": 1}), echo_step("b"), concurrency={"max_runs": 1}, **options)


def test_a_bug_that_repeats_fails_the_run_with_internal_error_after_three_walks(monkeypatch, settings):
    assert settings.PAL_WALK_CRASHES == 3
    crash_in_ready_once_a_ended(monkeypatch)
    flow = limited()
    run, _ = run_create(workflow_name=flow.name, input={"bug": True})
    after, _ = run_create(workflow_name=flow.name, input={})  # the group's next run: it waits for the slot

    assert drive(run) == "crashed"
    sweep_after_expiry(run)
    assert drive(run) == "crashed"
    assert run.status == RunStatus.RUNNING
    sweep_after_expiry(run)
    assert drive(run) == "failed"

    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "internal_error" and run.error["message"] == "KeyError: 'a bug in the walk'"
    assert run.error["details"]["crashes"] == 3 and "in buggy" in run.error["details"]["at"]
    assert [e.payload["crashes"] for e in step_events(run, "walk_crashed")] == [1, 2, 3]
    assert kinds(run)[-2:] == ["walk_crashed", "run_failed"]
    assert not RunLock.objects.filter(run_id=run.id).exists()
    # Its slot went on to the next run of the group, which runs to its end.
    after.refresh_from_db()
    assert booked_task_id(after)
    assert drive(after) == "walked" and after.status == RunStatus.SUCCEEDED


def test_a_crash_that_passes_costs_one_redrive_and_the_count_starts_again_when_a_step_ends(monkeypatch):
    crashes = crash_in_ready_once_a_ended(monkeypatch, times=2)
    run = make_run(workflow=workflow(tool_step("a", "test_count", {"n": 1}), echo_step("b")), input={"bug": True})

    assert drive(run) == "crashed"
    sweep_after_expiry(run)
    assert drive(run) == "crashed"
    sweep_after_expiry(run)
    assert drive(run) == "walked"

    assert run.status == RunStatus.SUCCEEDED and len(crashes) == 2
    assert [e.payload["crashes"] for e in step_events(run, "walk_crashed")] == [1, 2]


def test_the_crash_count_starts_again_once_the_walk_gets_past_the_point(monkeypatch, settings):
    crashes = crash_in_ready_once_a_ended(monkeypatch, times=2)
    run = make_run(workflow=workflow(tool_step("a", "test_count", {"n": 1}), echo_step("b")), input={"bug": True})
    drive(run)
    sweep_after_expiry(run)
    drive(run)
    sweep_after_expiry(run)
    drive(run)  # past it: a and b ended

    assert len(crashes) == 2 and crash_note(run_id=run.id, error=ValueError("x")).crashes == 1


@tool("test_integrity_error")
def integrity_error_tool(args, ctx):
    raise IntegrityError('duplicate key value violates unique constraint "orders_pkey"')


def test_a_tool_that_raises_a_database_error_of_its_own_fails_its_step_once_with_internal_error():
    # Not the database away (a connection lost): the tool's own bug, which a re-drive would only repeat.
    run = make_run(steps=[tool_step("a", "test_integrity_error", {})])

    assert drive(run) == "walked"

    assert run.status == RunStatus.FAILED
    [failed] = step_events(run, "step_failed", "a")
    assert failed.payload["code"] == "internal_error"
    assert failed.payload["message"].startswith("IntegrityError: duplicate key value")
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_a_data_error_of_ours_that_repeats_is_counted_and_fails_the_run_after_three_walks(monkeypatch):
    ready = Graph.ready

    def buggy(self):
        if "a" in self.walk.step_context:
            raise DataError("value too long for type character varying(64)")
        return ready(self)

    monkeypatch.setattr(Graph, "ready", buggy)
    run = make_run(steps=[tool_step("a", "test_count", {"n": 1}), echo_step("b")])

    assert drive(run) == "crashed"
    sweep_after_expiry(run)
    assert drive(run) == "crashed"
    sweep_after_expiry(run)
    assert drive(run) == "failed"

    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "internal_error"
    assert run.error["message"].endswith("DataError: value too long for type character varying(64)")


def test_a_lost_connection_is_not_counted_as_a_bug(monkeypatch):
    ready = Graph.ready

    def away(self):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Graph, "ready", away)
    run = make_run(steps=[echo_step("a")])
    for _ in range(4):
        assert drive(run) == "interrupted"
        sweep_after_expiry(run)
    monkeypatch.setattr(Graph, "ready", ready)
    assert drive(run) == "walked" and run.status == RunStatus.SUCCEEDED
    assert step_events(run, "walk_crashed") == []

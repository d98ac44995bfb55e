"""Pure steps in one commit (issue 29 section 2): consecutive pure steps (echo, a pure tool) share a commit,
bounded by PAL_PURE_BATCH_STEPS and PAL_PURE_BATCH_MS; a step with an effect has its step_started written before
it runs and its outcome before anything after it runs; a crash re-runs only pure steps."""

import dataclasses

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from runs.steps.tools import TOOLS
from runs.walk.walk import Walk
from tests.code import pure_tools
from tests.code.pure_tools import CALLS
from tests.helpers import Crash, drive, drive_to_end, make_run, sweep_after_expiry

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _batches(settings):
    settings.PAL_PURE_BATCH_STEPS = 10
    settings.PAL_PURE_BATCH_MS = 60_000  # the step count bounds the batch in these tests, not the clock
    CALLS.clear()
    assert pure_tools.count_pure  # registered


def pure(step_id, n=0):
    return {"id": step_id, "kind": "tool_call", "tool": "count_pure", "args": {"n": n}}


def effect(step_id, n=0):
    return {"id": step_id, "kind": "tool_call", "tool": "count_effect", "args": {"n": n}}


def replace_run(monkeypatch, name: str, run) -> None:
    monkeypatch.setitem(TOOLS, name, dataclasses.replace(TOOLS[name], run=run))


class Writes:
    """Counts the journal appends a walk makes (each is one commit of its own outside a transaction)."""

    def __init__(self, monkeypatch):
        self.count = 0
        write = Walk._write

        def counted(walk, events, *, fenced):
            self.count += 1
            return write(walk, events, fenced=fenced)

        monkeypatch.setattr(Walk, "_write", counted)


def test_thirty_pure_steps_take_three_writes_where_thirty_durable_ones_take_thirty(monkeypatch):
    writes = Writes(monkeypatch)
    run = make_run(steps=[pure(f"p{i}", i) for i in range(30)])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    batched = writes.count

    writes.count = 0
    run = make_run(steps=[effect(f"e{i}", i) for i in range(30)])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    print(f"writes for 30 steps: pure {batched}, durable {writes.count}")
    assert batched <= 5 and writes.count >= 30


def test_an_effect_runs_with_its_start_written_and_is_written_ended_before_the_next_step_runs(monkeypatch):
    seen = {}

    def looks_first(args, ctx):
        seen["effect"] = set(JournalEvent.objects.filter(run_id=ctx.run_id).values_list("kind", "step_id"))
        return {}

    def after_looks(args, ctx):
        seen["after"] = set(JournalEvent.objects.filter(run_id=ctx.run_id).values_list("kind", "step_id"))
        return {}

    replace_run(monkeypatch, "count_effect", looks_first)
    replace_run(monkeypatch, "count_pure", lambda args, ctx: after_looks(args, ctx) if ctx.step_id == "after" else {})
    run = make_run(steps=[pure("p1"), pure("p2"), effect("mail"), pure("after")])
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    assert {("step_started", "mail"), ("step_completed", "p1"), ("step_completed", "p2")} <= seen["effect"]
    assert ("step_completed", "mail") in seen["after"]


def test_a_crash_after_pure_steps_runs_only_them_again(monkeypatch):
    run_tool = TOOLS["count_pure"].run
    died = []

    def dies_at_p5(args, ctx):
        if ctx.step_id == "p5" and not died:
            died.append(1)
            raise Crash("killed")
        return run_tool(args, ctx)

    replace_run(monkeypatch, "count_pure", dies_at_p5)
    run = make_run(steps=[pure("p1"), effect("mail"), pure("p2"), pure("p3"), pure("p4"), pure("p5"), pure("p6")])
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    ran = [(c["step_id"], c["pure"]) for c in CALLS]
    twice = {step for step, _ in ran if [s for s, _ in ran].count(step) > 1}
    assert twice == {"p2", "p3", "p4"}  # the pure steps whose rows the crash took with it
    assert [c for c in CALLS if not c["pure"]] == [CALLS[1]] and CALLS[1]["step_id"] == "mail"  # the effect: once


def test_the_clock_bounds_a_batch_too(monkeypatch, settings):
    settings.PAL_PURE_BATCH_STEPS = 1000
    settings.PAL_PURE_BATCH_MS = 0.0  # every pure step is its own commit again
    writes = Writes(monkeypatch)
    run = make_run(steps=[pure(f"p{i}", i) for i in range(10)])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED and writes.count >= 10


def test_a_python_workflows_pure_steps_share_commits_and_its_effects_do_not(monkeypatch):
    writes = Writes(monkeypatch)
    seen = {}
    effect_run = TOOLS["count_effect"].run

    def looks_first(args, ctx):
        seen[ctx.step_id] = set(JournalEvent.objects.filter(run_id=ctx.run_id).values_list("kind", "step_id"))
        return effect_run(args, ctx)

    replace_run(monkeypatch, "count_effect", looks_first)
    run = Run.objects.get(id=pure_tools.pure_rounds.start({"rounds": 2, "pure": 15, "hook": ""}))
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    # 30 pure calls and 2 effects: the effects' own rows, and the pure ones in batches of 10.
    assert writes.count <= 12, writes.count
    # Each effect ran with every pure row before it written, its own start too.
    assert {("step_started", "effect"), ("step_completed", "p#15")} <= seen["effect"]
    assert {("step_completed", "effect"), ("step_completed", "p#30")} <= seen["effect#2"]
    assert [c["step_id"] for c in CALLS if not c["pure"]] == ["effect", "effect#2"]

"""One step's rows fold into the same state as the whole journal gives that step (replay_rows_for_step, which a
decision on an approval reads under the run's row lock instead of replaying the run): checked on a graph with an
approval, for_each items that fail and an operator's retry of them, an unknown outcome and a skipped step, at each
point of its life."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from journal.selectors import replay_rows_for_run, replay_rows_for_step
from runs.models import RunStatus
from runs.replay import replay
from runs.services import approval_decide, run_retry
from runs.steps.tools import tool
from tests.helpers import drive_to_end, make_run, tool_step

pytestmark = pytest.mark.django_db


def assert_each_step_folds_alone_as_in_the_whole_journal(run) -> set[str]:
    whole = replay(replay_rows_for_run(run_id=run.id))
    for step_id, state in whole.items():
        alone = replay(replay_rows_for_step(run_id=run.id, step_id=step_id))
        assert set(alone) == {step_id}
        assert vars(alone[step_id]) == vars(state), step_id  # not asdict: it copies MISSING
    return set(whole)


def test_a_steps_own_rows_fold_into_the_state_the_whole_journal_gives_it():
    run = make_run(
        steps=[
            {"id": "ok", "kind": "approval", "prompt": "go?", "needs": []},
            tool_step("fan", "test_fail_before", {"succeed_on": 2}, for_each="{{ input.xs }}", needs=[]),
            tool_step("flaky", "test_unknown_once", {"f": 1}, needs=[]),
            tool_step("skip", "echo", {}, needs=[], when="input.n == 2"),
            tool_step("end", "echo", {"done": True}, needs=["ok", "fan", "flaky", "skip"]),
        ],
        input={"xs": [1, 2, 3], "n": 1},
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED  # the items failed their one attempt
    assert_each_step_folds_alone_as_in_the_whole_journal(run)
    run_retry(run_id=run.id, by="otto", reason="the peer is back")  # run_retried rows: each item's attempt 2
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    seen = assert_each_step_folds_alone_as_in_the_whole_journal(run)
    assert {"ok", "fan[0]", "fan[2]", "flaky", "skip"} <= seen

    approval_decide(run_id=run.id, step_id="ok", approved=True, by="otto")
    assert_each_step_folds_alone_as_in_the_whole_journal(run)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    assert "end" in assert_each_step_folds_alone_as_in_the_whole_journal(run)


def test_a_step_with_no_rows_folds_into_nothing():
    run = make_run(steps=[tool_step("a", "echo", {})])
    drive_to_end(run)

    assert replay(replay_rows_for_step(run_id=run.id, step_id="nope")) == {}


def test_a_decision_taken_while_the_run_still_runs_reads_only_its_steps_rows_under_the_lock():
    seen: dict = {}

    @tool("test_decide_and_look")
    def decide_and_look(args, ctx):
        """Runs after the approval's branch parked, while the run is still running: an operator decides now."""
        if ctx.run_id not in seen:
            with CaptureQueriesContext(connection) as queries:
                approval_decide(run_id=ctx.run_id, step_id="ok", approved=True, by="otto")
            seen[ctx.run_id] = [q["sql"] for q in queries.captured_queries]
        return args

    run = make_run(
        steps=[
            {"id": "ok", "kind": "approval", "prompt": "go?", "needs": []},
            *[tool_step(f"w{i}", "echo", {"i": i}, needs=[]) for i in range(5)],  # rows of other steps
            tool_step("meanwhile", "test_decide_and_look", {}, needs=["w0", "w1", "w2", "w3", "w4"]),
            tool_step("end", "echo", {"ok": "{{ steps.ok.output.approved }}"}, needs=["ok", "meanwhile"]),
        ]
    )
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED and run.output == {"ok": True}
    # The rows read to decide (the ORM's; the append's own one-row read of the journal's tail aside): the step's.
    reads = [sql for sql in seen[str(run.id)] if sql.startswith("SELECT") and '"journal_events"' in sql]
    assert reads and all('"journal_events"."step_id" =' in sql for sql in reads), reads

"""A walk that ends the run (Walk.finish) or parks it on its budget (Walk.park_on_budget) while an operator decides
an approval of one of its parked branches, on Postgres: both write the run's status row before its journal, as the
decision does (it locks the row, then appends), so neither waits for the other while holding what the other needs.

Before, the walk appended its last rows, then wrote the status: paused between the two while a decision took the
row, Postgres found a deadlock (issue 23, section 7)."""

import threading

import pytest
from django.db import DatabaseError, connection

import runs.walk.writer as writer
from runs.models import Run, RunStatus
from runs.services import Conflict, approval_decide, workflow_create
from runs.walk import drive as executor
from tests.helpers import booked_task_id, echo_step, make_run, tool_step
from tests.services.test_wake_cancel_lock_order import _a_lock_wait_in_this_database, _in_thread

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REVIEW = {"id": "review", "kind": "approval", "prompt": "ship it?", "needs": []}
ENDINGS = {
    # A branch fails for good while the approval is parked (and journaled): the run fails (Walk.finish).
    "finish": (
        {
            "name": "ends",
            "steps": [
                REVIEW,
                tool_step("slow", "sleep", {"seconds": 0.2}, needs=[]),
                tool_step("boom", "test_fail", needs=["slow"]),
            ],
        },
        "run_failed",
        RunStatus.FAILED,
    ),
    # The model call spends the budget while the approval is parked: the next step parks the run on its budget.
    "budget": (
        {
            "name": "spends",
            "budget": {"max_tokens": 1},
            "steps": [
                REVIEW,
                {"id": "ask", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "hello there", "needs": []},
                {**echo_step("more"), "needs": ["ask"]},
            ],
        },
        "run_waiting",
        RunStatus.WAITING,
    ),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_walk_ending_the_run_and_a_decision_on_its_parked_approval_both_finish(monkeypatch, ending):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    definition, last_kind, status = ENDINGS[ending]
    workflow = workflow_create(definition=definition)
    run = make_run(workflow=workflow)
    locked, go_on = threading.Event(), threading.Event()
    append = writer.events_append  # the walk's rows go through its JournalWriter

    def append_then_pause(**kwargs):
        seqs = append(**kwargs)
        # The run's own ending row: run_failed names the failed step; the budget's run_waiting names none (a
        # branch's own run_waiting, journaled earlier, names its step).
        ending_rows = any(
            event.kind == last_kind and (event.step_id is None or last_kind == "run_failed")
            for event in kwargs["events"]
        )
        if threading.current_thread().name == "walk" and ending_rows and not locked.is_set():
            locked.set()  # the walk's ending rows are written, its commit not yet made
            assert go_on.wait(timeout=30), "the test never let the walk go on"
        return seqs

    monkeypatch.setattr(writer, "events_append", append_then_pause)
    outcome: dict = {}
    task = booked_task_id(run)
    walk = _in_thread(lambda: executor.run_drive(run_id=run.id, task_id=task), outcome, "walk")
    decide = _in_thread(
        lambda: approval_decide(run_id=run.id, step_id="review", approved=True, by="otto").status, outcome, "decide"
    )
    walk.start()
    assert locked.wait(timeout=30), outcome
    decide.start()
    for _ in range(600):  # until the decision waits for one of the walk's locks (or is done)
        if _a_lock_wait_in_this_database() or not decide.is_alive():
            break
        decide.join(timeout=0.05)
    go_on.set()
    walk.join(timeout=60), decide.join(timeout=60)

    assert outcome["walk"] == "walked", outcome
    assert not isinstance(outcome["decide"], DatabaseError), outcome  # no deadlock broken by Postgres
    # The walk's commit came first: the decision then finds the run no longer running, and says so.
    assert isinstance(outcome["decide"], Conflict), outcome
    assert Run.objects.get(id=run.id).status == status

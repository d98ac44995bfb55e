"""An approval decision is for one attempt of the step (issue 10 section 7): a late or doubled decision for
attempt 1 never decides attempt 2, the retry's new wait."""

import pytest

from runs.models import RunStatus
from runs.services import Conflict, approval_decide, run_wake
from tests.helpers import drive, drive_to_end, echo_step, kinds, make_run, step_events

pytestmark = pytest.mark.django_db

RETRIED_APPROVAL = {"id": "review", "kind": "approval", "prompt": "Send the reply?", "retry": {"max_attempts": 2}}


def waiting_on_attempt_2():
    """A run whose approval was rejected once (attempt 1) and now waits on attempt 2."""
    run = make_run(steps=[RETRIED_APPROVAL, echo_step("after", by="{{ steps.review.output.by }}")])
    drive(run)
    approval_decide(run_id=run.id, step_id="review", approved=False, by="alice", comment="no", attempt=1)
    drive_to_end(run)
    assert run.status == RunStatus.WAITING, kinds(run)
    assert run.waiting_on["attempt"] == 2
    return run


def test_a_doubled_rejection_of_attempt_1_does_not_reject_attempt_2():
    run = waiting_on_attempt_2()
    before = kinds(run)

    with pytest.raises(Conflict) as refused:
        approval_decide(run_id=run.id, step_id="review", approved=False, by="alice", comment="no", attempt=1)

    assert refused.value.status == 409
    assert refused.value.code == "not_waiting_on_approval"
    assert "attempt 1" in refused.value.detail and "attempt 2" in refused.value.detail
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.waiting_on["attempt"] == 2
    assert kinds(run) == before  # nothing journaled


def test_attempt_2_is_decided_by_a_decision_for_attempt_2_and_the_run_goes_on():
    run = waiting_on_attempt_2()

    approval_decide(run_id=run.id, step_id="review", approved=True, by="bob", comment="now yes", attempt=2)
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"by": "bob"}
    decided = step_events(run, "approval_decided", "review")
    assert [(e.attempt, e.payload["attempt"], e.payload["approved"]) for e in decided] == [(1, 1, False), (2, 2, True)]
    assert [e.attempt for e in step_events(run, "step_failed", "review")] == [1]


def test_a_decision_without_an_attempt_decides_the_attempt_waiting_now_and_says_which():
    run = make_run(steps=[RETRIED_APPROVAL])
    drive(run)

    approval_decide(run_id=run.id, step_id="review", approved=True, by="carol")

    (decided,) = step_events(run, "approval_decided", "review")
    assert (decided.attempt, decided.payload["attempt"]) == (1, 1)


def test_the_approval_step_ignores_a_journaled_decision_for_another_attempt():
    # What a decision made before decisions named their attempt could leave: a rejection meant for attempt 1
    # journaled while attempt 2 waits. The step does not count it and waits on.
    run = waiting_on_attempt_2()
    stray = {"approved": False, "by": "late", "comment": "meant for attempt 1", "attempt": 1}
    assert run_wake(
        run_id=run.id,
        by="late",
        why="stray decision",
        expect={"kind": "approval"},
        extra_events=[("approval_decided", stray)],
    )

    drive(run)

    assert run.status == RunStatus.WAITING, kinds(run)
    assert run.waiting_on["attempt"] == 2
    assert [e.attempt for e in step_events(run, "step_failed", "review")] == [1]

"""POST /runs/{id}/approvals/{step_id} with the attempt it decides (optional; issue 10 section 7)."""

import pytest

from journal.models import JournalEvent
from runs.models import RunStatus
from tests.helpers import drive, drive_to_end, make_run

pytestmark = pytest.mark.django_db


def waiting_on_approval(max_attempts: int = 2):
    run = make_run(
        steps=[{"id": "review", "kind": "approval", "prompt": "Send it?", "retry": {"max_attempts": max_attempts}}]
    )
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def test_a_doubled_rejection_of_attempt_1_gets_409_and_attempt_2_still_waits(operator):
    run = waiting_on_approval()
    first = operator.post(f"/runs/{run.id}/approvals/review", {"approved": False, "comment": "no", "attempt": 1})
    assert first.status_code == 200, first.content
    drive_to_end(run)
    assert run.waiting_on["attempt"] == 2

    again = operator.post(f"/runs/{run.id}/approvals/review", {"approved": False, "comment": "no", "attempt": 1})

    assert again.status_code == 409
    assert again.json()["code"] == "not_waiting_on_approval"
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.waiting_on["attempt"] == 2
    assert JournalEvent.objects.filter(run_id=run.id, kind="approval_decided").count() == 1


def test_an_approval_without_an_attempt_still_decides_the_waiting_attempt(operator):
    run = waiting_on_approval()

    response = operator.post(f"/runs/{run.id}/approvals/review", {"approved": True, "comment": "fine"})

    assert response.status_code == 200
    decided = JournalEvent.objects.get(run_id=run.id, kind="approval_decided")
    assert (decided.attempt, decided.payload["attempt"]) == (1, 1)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("attempt", [0, "1", True, 1.5])
def test_an_attempt_that_is_not_a_whole_number_from_1_is_422_naming_it(operator, attempt):
    run = waiting_on_approval()

    response = operator.post(f"/runs/{run.id}/approvals/review", {"approved": True, "attempt": attempt})

    assert response.status_code == 422
    assert "attempt" in response.content.decode()

"""The run page's approval form carries the attempt it shows (issue 10 section 7)."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive, drive_to_end, make_run, step_events

from .conftest import htmx

pytestmark = pytest.mark.django_db


def test_the_approval_form_carries_the_attempt_and_a_stale_form_cannot_decide_the_next_attempt(operator):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Send it?", "retry": {"max_attempts": 2}}])
    drive(run)
    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert '<input type="hidden" name="attempt" value="1">' in page
    rejected = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "0", "attempt": "1"}, headers=htmx("run-actions")
    )
    assert rejected.status_code == 200
    drive_to_end(run)
    assert run.waiting_on["attempt"] == 2

    stale = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "0", "attempt": "1"}, headers=htmx("run-actions")
    )

    assert stale.status_code == 409
    assert "does not wait on approval" in stale.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert [e.attempt for e in step_events(run, "approval_decided")] == [1]
    assert '<input type="hidden" name="attempt" value="2">' in operator.get(f"/runs/{run.id}/").content.decode()


def test_a_form_attempt_that_is_not_a_number_is_refused_clearly(operator):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Send it?"}])
    drive(run)

    response = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "1", "attempt": "one"}, headers=htmx("run-actions")
    )

    assert response.status_code == 400
    assert "attempt must be a whole number" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING

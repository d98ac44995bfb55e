"""Rules written once (issue 11 section 4): a run's creation, a cancel's reason, a lease's liveness."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import leases
from runs.models import Run, RunStatus
from runs.services import ServiceError, run_cancel, workflow_create
from tests.helpers import drive, echo_step, events, make_run

pytestmark = pytest.mark.django_db


def test_a_child_run_is_created_the_way_every_run_is_and_its_run_created_says_whose_step_made_it():
    workflow_create(definition={"name": "asks", "steps": [{"id": "ok", "kind": "approval", "prompt": "go?"}]})
    parent = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "asks", "input": {"n": 1}}])
    drive(parent)
    child = Run.objects.get(parent_run_id=parent.id)

    created = {run.id: events(run)[0] for run in (parent, child)}
    assert {e.kind for e in created.values()} == {"run_created"}
    assert set(created[child.id].payload) == set(created[parent.id].payload)  # one shape for both
    assert created[parent.id].payload["parent_run_id"] is None and created[parent.id].payload["depth"] == 0
    assert {k: created[child.id].payload[k] for k in ("workflow", "input", "parent_run_id", "parent_step_id")} == {
        "workflow": "asks",
        "input": {"n": 1},
        "parent_run_id": str(parent.id),
        "parent_step_id": "sub",
    }
    assert (created[child.id].payload["parent_attempt"], created[child.id].payload["depth"]) == (1, 1)
    assert (child.depth, child.parent_attempt, child.created_by) == (1, 1, f"run {parent.id}")


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_cancel_without_a_reason_is_refused_by_the_service_itself_and_nothing_changes(reason):
    run = make_run(steps=[echo_step("a")])
    journal = len(events(run))

    with pytest.raises(ServiceError) as refused:
        run_cancel(run_id=run.id, by="otto", reason=reason)

    assert (refused.value.code, refused.value.status) == ("reason_required", 400)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and len(events(run)) == journal


def test_a_lease_is_live_until_the_moment_it_expires_and_not_after():
    now = timezone.now()
    assert leases.lease_live(now, now=now)
    assert leases.lease_live(now + timedelta(seconds=1), now=now)
    assert not leases.lease_live(now - timedelta(microseconds=1), now=now)
    assert not leases.lease_live(None, now=now)

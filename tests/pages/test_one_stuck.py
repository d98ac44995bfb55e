"""One definition of "stuck" (runs.selectors.stuck_runs and its three causes): the sweep, GET /runs?stuck=true, the
runs page's stuck filter, /ops/ and a bulk action's preview all name the same runs."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs.explain import stuck_runs_grouped
from runs.models import Run, RunLock, RunStatus
from runs.recovery import parents_of_moved_children, stuck_run_ids, sweep_once
from runs.selectors import stuck_timer_overdue
from runs.services import bulk_preview, workflow_create
from tests.api.conftest import Api, token_for
from tests.helpers import drive, echo_step, expire_lease, make_run, tool_step

from .conftest import make_user

pytestmark = pytest.mark.django_db

UUID = re.compile(r'data-run="([0-9a-f-]{36})"')


def parked_pair():
    """A parent parked on its child, which waits on an approval: (parent, child), neither stuck."""
    parent = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "asks", "input": {}}, echo_step("after")])
    drive(parent)
    child = Run.objects.get(parent_run_id=parent.id)
    assert (parent.status, child.status) == (RunStatus.WAITING, RunStatus.WAITING)
    return parent, child


@pytest.fixture
def fleet():
    """Runs in every state that matters to the rule; returns (the stuck ones by cause, the ones that are not)."""
    workflow_create(definition={"name": "asks", "steps": [{"id": "ok", "kind": "approval", "prompt": "go?"}]})
    past = timezone.now() - timedelta(minutes=5)

    crashed = make_run(steps=[tool_step("a", "test_crash_once"), echo_step("b")])
    with pytest.raises(BaseException, match="crash"):
        drive(crashed)
    expire_lease(crashed)  # its worker died holding the lease
    lost_message = make_run(steps=[echo_step("a")])
    expire_lease(lost_message)  # booked for a task no worker took
    healthy = make_run(steps=[echo_step("a")])  # booked just now: a worker will take it

    napping = make_run(steps=[{"id": "nap", "kind": "sleep", "seconds": 3600}])
    drive(napping)
    overdue = make_run(steps=[{"id": "nap", "kind": "sleep", "seconds": 3600}])
    drive(overdue)
    Run.objects.filter(id=overdue.id).update(wake_at=past)  # its wake-up task was lost

    moved_parent, moved_child = parked_pair()
    Run.objects.filter(id=moved_child.id).update(status=RunStatus.SUCCEEDED, output={})  # the wake-up was lost
    waiting_parent, waiting_child = parked_pair()  # both wait, as they should

    # A parent that lost its worker while it drove its child: the sweep re-drives the parent (which adopts the
    # child), never the child on its own, so only the parent is stuck.
    driving_parent, driven_child = parked_pair()
    Run.objects.filter(id__in=[driving_parent.id, driven_child.id]).update(status=RunStatus.RUNNING, waiting_on=None)
    # An orphan: its parent ended, so nothing but the sweep will drive it.
    orphans_parent, orphan = parked_pair()
    Run.objects.filter(id=orphans_parent.id).update(status=RunStatus.FAILED, waiting_on=None)
    Run.objects.filter(id=orphan.id).update(status=RunStatus.RUNNING, waiting_on=None)
    assert not RunLock.objects.filter(run_id__in=[driving_parent.id, driven_child.id, orphan.id]).exists()

    stuck = {
        "redrive": {crashed.id, lost_message.id, driving_parent.id, orphan.id},
        "timer": {overdue.id},
        "moved_child": {moved_parent.id},
    }
    fine = {healthy.id, napping.id, moved_child.id, waiting_parent.id, waiting_child.id, driven_child.id}
    return stuck, fine


def test_the_sweep_the_api_the_runs_page_ops_and_a_bulk_preview_name_the_same_stuck_runs(fleet):
    stuck_by_cause, _fine = fleet
    stuck = set().union(*stuck_by_cause.values())

    # What the sweep works through, cause by cause (the lists sweep_once reads).
    assert set(stuck_run_ids()) == stuck_by_cause["redrive"]
    assert set(stuck_timer_overdue().values_list("id", flat=True)) == stuck_by_cause["timer"]
    assert {parent for parent, *_ in parents_of_moved_children()} == stuck_by_cause["moved_child"]

    api = Api(token_for(make_user("vera", "runs.view_run")))
    answer = api.get("/runs", {"stuck": "true", "limit": 200})
    assert answer.status_code == 200
    assert {item["id"] for item in answer.json()["items"]} == {str(i) for i in stuck}

    page = Client()
    page.force_login(make_user("otto", "runs.view_run", "runs.operate"))
    rows = page.get("/runs/", {"stuck": "1"}, headers={"HX-Request": "true", "HX-Target": "run-rows"})
    assert rows.status_code == 200
    assert set(UUID.findall(rows.content.decode())) == {str(i) for i in stuck}

    grouped = stuck_runs_grouped()
    assert {row["run"].id for group in grouped for row in group["runs"]} == stuck
    ops = page.get("/ops/", headers={"HX-Request": "true", "HX-Target": "stuck"}).content.decode()
    assert set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', ops)) == {str(i) for i in stuck}

    preview = bulk_preview(action="cancel", filters={"stuck": True})
    assert (preview["count"], set(preview["sample"])) == (len(stuck), {str(i) for i in stuck})

    # And what the sweep then moves is exactly that set.
    sweep = sweep_once()
    assert set(sweep.redriven) | set(sweep.woken) == {str(i) for i in stuck}


def test_a_bulk_action_picks_exactly_the_runs_that_the_list_shows_for_the_same_filters(db):
    workflow_create(definition={"name": "alpha", "steps": [echo_step("a")]})
    workflow_create(definition={"name": "beta", "steps": [echo_step("a")]})
    from runs.services import run_create

    made = {name: [run_create(workflow_name=name)[0] for _ in range(3)] for name in ("alpha", "beta")}
    Run.objects.filter(id=made["alpha"][0].id).update(status=RunStatus.FAILED)
    api = Api(token_for(make_user("vera", "runs.view_run")))

    for filters in (
        {"workflow": "alpha"},
        {"workflow": "beta", "status": "queued"},
        {"q": str(made["beta"][1].id)[:8]},
    ):
        listed = {item["id"] for item in api.get("/runs", {**filters, "limit": 200}).json()["items"]}
        if "q" in filters:  # the API has no q; the page has it: read the page's rows
            page = Client()
            page.force_login(make_user(f"p{len(listed)}", "runs.view_run"))
            rows = page.get("/runs/", filters, headers={"HX-Request": "true", "HX-Target": "run-rows"})
            listed = set(UUID.findall(rows.content.decode()))
        unfinished = {
            str(i) for i in Run.objects.filter(id__in=listed).exclude(status="failed").values_list("id", flat=True)
        }
        preview = bulk_preview(action="cancel", filters=filters)
        assert set(preview["sample"]) == unfinished and preview["count"] == len(unfinished), filters

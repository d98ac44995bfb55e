"""A concurrency group's limit holds through wake-ups and child runs (issue 14): a woken run asks for a slot again
(queued on its group, with a why, when the group is full), a child run takes a slot of its own workflow's group (its
parent's step waits on it while it is held back), and a child in its ancestor's group rides on that one's slot."""

import uuid

import pytest

from runs.explain import run_why
from runs.leases import lease_reserve
from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.selectors import stuck_runs
from runs.services import approval_decide, run_create, signal_send, workflow_create
from tests.helpers import drive, echo_step, events

pytestmark = pytest.mark.django_db

ENDINGS = ("run_succeeded", "run_failed", "run_cancelled")


@pytest.fixture(autouse=True)
def _one_step_per_slice(settings):
    settings.PAL_SLICE_SECONDS = 0.000001  # each task walks one step and hands the run to a new task


def booked(runs) -> list[Run]:
    """The runs a task is on its way for (a booking): what workers would take."""
    held = set(
        RunLock.objects.filter(run_id__in=[r.id for r in runs], owner__startswith="task:").values_list(
            "run_id", flat=True
        )
    )
    return [r for r in runs if r.id in held]


def work_off(runs) -> None:
    """Drive booked tasks one at a time, round robin as several workers would, until nothing is booked."""
    last: dict = {}
    for turn in range(500):
        ready = booked(runs)
        if not ready:
            return
        chosen = min(ready, key=lambda r: last.get(r.id, -1))
        last[chosen.id] = turn
        drive(chosen)
    raise AssertionError("the runs did not settle")


def running_intervals(run: Run) -> list[tuple]:
    """From the run's journal: (when it began, when it ended) each stretch it ran. It runs from a run_started, or a
    run_resumed that was not queued on its group, to a run_waiting or its ending."""
    stretches, began = [], None
    for event in events(run):
        payload = event.payload if isinstance(event.payload, dict) else {}
        if began is None and (event.kind == "run_started" or (event.kind == "run_resumed" and "queued" not in payload)):
            began = event.created_at
        elif began is not None and (event.kind == "run_waiting" or event.kind in ENDINGS):
            stretches.append((began, event.created_at))
            began = None
    if began is not None:
        stretches.append((began, None))
    return stretches


def most_running_at_once(runs: list[Run]) -> int:
    """+1 at each stretch's start, -1 at its end; an end before a start at the same instant."""
    marks = []
    for run in runs:
        for began, ended in running_intervals(run):
            marks.append((began, 1))
            if ended is not None:
                marks.append((ended, -1))
    most = now = 0
    for _at, change in sorted(marks, key=lambda m: (m[0], m[1])):
        now += change
        most = max(most, now)
    return most


def test_a_woken_run_waits_queued_for_a_slot_until_the_run_that_took_it_ends():
    workflow_create(
        definition={
            "name": "one-at-a-time",
            "concurrency": {"key": "{{ input.customer }}", "max_runs": 1},
            "steps": [
                {"id": "ok", "kind": "approval", "prompt": "go?", "when": "input.ask"},
                echo_step("work"),
                echo_step("more"),
            ],
        }
    )
    a, _ = run_create(workflow_name="one-at-a-time", input={"customer": "acme", "ask": True})
    drive(a)  # parks on its approval: its slot goes back
    b, _ = run_create(workflow_name="one-at-a-time", input={"customer": "acme", "ask": False})
    drive(b)  # takes the free slot, walks one step, hands off: still running
    assert (a.status, b.status) == (RunStatus.WAITING, RunStatus.RUNNING)

    approval_decide(run_id=a.id, step_id="ok", approved=True, by="otto")

    a.refresh_from_db()
    assert a.status == RunStatus.QUEUED and a.waiting_on["kind"] == "concurrency"
    assert run_why(a).startswith("concurrency one-at-a-time:acme: 1 of 1 running")
    assert not RunLock.objects.filter(run_id=a.id).exists()  # no lease, no task: nothing polls it
    assert a.id not in set(stuck_runs().values_list("id", flat=True))
    assert str(a.id) not in sweep_once().redriven
    (resumed,) = [e for e in events(a) if e.kind == "run_resumed"]
    assert resumed.payload["queued"]["max_runs"] == 1  # the decision counted; the run waits for its slot
    assert [e.kind for e in events(a)].count("approval_decided") == 1

    work_off([a, b])

    a.refresh_from_db(), b.refresh_from_db()
    assert (a.status, b.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)
    assert most_running_at_once([a, b]) == 1
    b_ended = next(e.created_at for e in events(b) if e.kind == "run_succeeded")
    a_again = [e.created_at for e in events(a) if e.kind == "run_started"][-1]
    assert a_again > b_ended  # A went on only once B had ended


def test_woken_runs_take_freed_slots_in_creation_order():
    workflow_create(
        definition={
            "name": "signalled",
            "concurrency": {"max_runs": 1},
            "steps": [
                {"id": "go", "kind": "signal", "name": "go", "when": "input.wait"},
                echo_step("work"),
                echo_step("more"),
            ],
        }
    )
    first, _ = run_create(workflow_name="signalled", input={"wait": True})
    second, _ = run_create(workflow_name="signalled", input={"wait": True})
    drive(first), drive(second)  # each parks on its signal (the first gives its slot to the second)
    busy, _ = run_create(workflow_name="signalled", input={"wait": False})
    drive(busy)  # holds the only slot
    assert busy.status == RunStatus.RUNNING
    signal_send(run_id=second.id, name="go", by="otto")  # the younger wakes first
    signal_send(run_id=first.id, name="go", by="otto")
    second.refresh_from_db(), first.refresh_from_db()
    assert (first.status, second.status) == (RunStatus.QUEUED, RunStatus.QUEUED)

    work_off([first, second, busy])

    runs = [first, second, busy]
    for run in runs:
        run.refresh_from_db()
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}
    assert most_running_at_once(runs) == 1
    restarted = {r.id: [e.created_at for e in events(r) if e.kind == "run_started"][-1] for r in (first, second)}
    assert restarted[first.id] < restarted[second.id]  # creation order, not the order they were woken


def test_a_child_over_its_groups_limit_is_held_back_and_its_parent_waits_on_it():
    workflow_create(
        definition={"name": "scarce", "concurrency": {"max_runs": 1}, "steps": [echo_step("a"), echo_step("b")]}
    )
    workflow_create(
        definition={
            "name": "caller",
            "steps": [{"id": "kid", "kind": "child_run", "workflow": "scarce", "input": {}}, echo_step("after")],
        }
    )
    hog, _ = run_create(workflow_name="scarce")
    drive(hog)  # holds scarce's only slot
    parent, _ = run_create(workflow_name="caller")
    drive(parent)

    child = Run.objects.get(parent_run_id=parent.id)
    assert child.status == RunStatus.QUEUED and child.waiting_on["kind"] == "concurrency"
    assert run_why(child).startswith("concurrency scarce:: 1 of 1 running")
    assert "run_started" not in [e.kind for e in events(child)]
    assert parent.status == RunStatus.WAITING
    assert (parent.waiting_on["kind"], parent.waiting_on["child_run_id"]) == ("child", str(child.id))
    assert parent.id not in set(stuck_runs().values_list("id", flat=True))  # nothing for the sweep to do
    swept = sweep_once()
    assert str(parent.id) not in swept.woken and str(child.id) not in swept.redriven

    work_off([hog, child, parent])

    for run in (hog, child, parent):
        run.refresh_from_db()
    assert (hog.status, child.status, parent.status) == (RunStatus.SUCCEEDED,) * 3
    assert most_running_at_once([hog, child]) == 1
    hog_ended = next(e.created_at for e in events(hog) if e.kind == "run_succeeded")
    assert next(e.created_at for e in events(child) if e.kind == "run_started") > hog_ended


def test_a_child_in_its_parents_group_rides_on_the_parents_slot():
    # A workflow that calls itself for the same customer, limit 1: a child taking a slot of its own would wait
    # for its parent, which waits for it.
    workflow_create(
        definition={
            "name": "recursive",
            "concurrency": {"key": "{{ input.customer }}", "max_runs": 1},
            "steps": [
                {
                    "id": "deeper",
                    "kind": "child_run",
                    "workflow": "recursive",
                    "input": {"customer": "{{ input.customer }}", "leaf": True},
                    "when": "not input.leaf",
                },
                echo_step("work"),
            ],
        }
    )
    parent, _ = run_create(workflow_name="recursive", input={"customer": "acme"})
    other, _ = run_create(workflow_name="recursive", input={"customer": "acme"})

    work_off([parent, other])

    parent.refresh_from_db(), other.refresh_from_db()
    child = Run.objects.get(parent_run_id=parent.id)
    assert (parent.status, child.status, other.status) == (RunStatus.SUCCEEDED,) * 3
    assert child.concurrency_key is None  # no slot of its own
    assert not [e for e in events(child) if e.kind == "run_resumed"]  # never held back
    assert most_running_at_once([parent, other]) == 1


def test_a_parent_woken_while_its_child_walks_under_its_own_task_waits_on_it_and_never_takes_its_lease(settings):
    """Issue 23, section 7: the parent's walk took the child's lease (lease_take), waited a TTL and two beats for
    the child's own walk to give it up, was fenced out, re-driven, and did it again until the child ended."""
    settings.PAL_LEASE_TTL = 2  # before the fix, each such walk waited 2 s + 2 beats, then was fenced out
    workflow_create(
        definition={"name": "scarce", "concurrency": {"max_runs": 1}, "steps": [echo_step("a"), echo_step("b")]}
    )
    workflow_create(
        definition={
            "name": "caller",
            "steps": [
                {"id": "kid", "kind": "child_run", "workflow": "scarce", "input": {}, "needs": []},
                {"id": "review", "kind": "approval", "prompt": "go on?", "needs": []},
                {**echo_step("after"), "needs": ["kid", "review"]},
            ],
        }
    )
    hog, _ = run_create(workflow_name="scarce")
    drive(hog)  # its first slice: it holds scarce's only slot
    parent, _ = run_create(workflow_name="caller")
    work_off([parent])
    child = Run.objects.get(parent_run_id=parent.id)
    assert held_back_on_its_group(child) and parent.status == RunStatus.WAITING
    work_off([hog])  # hog ends; its slot is handed to the child, booked for a task of its own
    child.refresh_from_db()
    drive(child)  # that task's first slice: the child runs on its own now, between slices
    child.refresh_from_db()
    assert child.status == RunStatus.RUNNING
    RunLock.objects.filter(run_id=child.id).update(owner="another-worker:1:cafe")  # its task, on another worker
    child_lease = RunLock.objects.get(run_id=child.id)

    approval_decide(run_id=parent.id, step_id="review", approved=True, by="otto")  # wakes the parent
    assert drive(parent) == "walked"  # not "fenced": it did not wait for the child's lease

    parent.refresh_from_db()
    assert parent.status == RunStatus.WAITING
    assert parent.waiting_on["kind"] == "child" and parent.waiting_on["child_run_id"] == str(child.id)
    assert RunLock.objects.get(run_id=child.id).epoch == child_lease.epoch  # the child's lease untouched
    assert parent.id not in set(stuck_runs().values_list("id", flat=True))  # the child's ending will wake it
    # The child's walk goes on (a task of its own again) and ends: that wakes the parent, which ends too.
    work_off_from(child)
    work_off([parent])
    for run in (child, parent):
        run.refresh_from_db()
    assert (child.status, parent.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)


def held_back_on_its_group(run: Run) -> bool:
    run.refresh_from_db()
    return run.status == RunStatus.QUEUED and (run.waiting_on or {}).get("kind") == "concurrency"


def work_off_from(run: Run) -> None:
    """Drive the run slice after slice under a task of its own until it ends (its lease booked for a new task)."""
    for _ in range(50):
        run.refresh_from_db()
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
            return
        booked_runs = booked([run])
        if not booked_runs:
            lease_reserve(run_id=run.id, task_id=f"t-{uuid.uuid4()}", force=True)
        drive(run)
    raise AssertionError(f"run {run.id} did not end")

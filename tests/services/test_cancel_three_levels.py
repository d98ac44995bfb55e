"""A cancel of the middle run of a three-level tree (root -> middle -> leaf, all parked) on Postgres, while a wake-up of
the leaf, or the leaf's ending, has booked the root's lease and not yet locked the rows above the leaf: the worst
moment. Both finish, and the root's walk then finds the middle run cancelled.

Before, the cancel locked the middle run's row, then the root's, and only then booked the root's lease (to send its
walk), while the wake-up (or the ending, through run_wake of its parent) had booked the root's lease first and then
locked the rows from the leaf up: each waited for what the other held, and Postgres broke the deadlock by failing
one of them. Now a cancel books the root's lease before it locks any status row, the order run_wake uses
(runs.services.run_cancel)."""

import threading

import pytest
from django.db import connection

from runs import leases
from runs.models import Run, RunLock, RunStatus
from runs.services import approval_decide, run_cancel, run_create, workflow_create
from runs.walk import run_drive
from tests.helpers import booked_task_id, drive, drive_to_end, echo_step, events
from tests.services.test_wake_cancel_lock_order import _a_lock_wait_in_this_database, _in_thread

# Row locks and deadlock detection are Postgres's: an integration test, run in make test's Postgres pass.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def tree(*, leaf_steps: list[dict], leaf_concurrency: dict | None = None) -> Run:
    workflow_create(
        definition={
            "name": "leaf",
            "steps": leaf_steps,
            **({"concurrency": leaf_concurrency} if leaf_concurrency else {}),
        }
    )
    workflow_create(definition={"name": "middle", "steps": [{"id": "sub", "kind": "child_run", "workflow": "leaf"}]})
    workflow_create(
        definition={
            "name": "top",
            "steps": [{"id": "sub", "kind": "child_run", "workflow": "middle"}, echo_step("after")],
        }
    )
    root, _ = run_create(workflow_name="top", input={})
    return root


def pause_after_booking_the_root(monkeypatch, *, root: Run, thread: str):
    """Hold the named thread right after it booked the root's lease (its row locked by that booking, no status row
    above the leaf locked yet) until the test lets it go on. Returns (locked, go_on)."""
    locked, go_on = threading.Event(), threading.Event()
    reserve = leases.lease_reserve

    def reserve_then_pause(*, run_id, **kwargs):
        fence = reserve(run_id=run_id, **kwargs)
        if threading.current_thread().name == thread and str(run_id) == str(root.id) and not locked.is_set():
            locked.set()
            assert go_on.wait(timeout=30), "the test never let it go on"
        return fence

    monkeypatch.setattr(leases, "lease_reserve", reserve_then_pause)
    return locked, go_on


def race(first: threading.Thread, cancel: threading.Thread, locked: threading.Event, go_on: threading.Event, outcome):
    first.start()
    assert locked.wait(timeout=30), outcome
    cancel.start()
    for _ in range(600):  # until the cancel waits for a lock the first holds (or, had it none to wait for, is done)
        if _a_lock_wait_in_this_database() or not cancel.is_alive():
            break
        cancel.join(timeout=0.05)
    go_on.set()
    first.join(timeout=60), cancel.join(timeout=60)
    assert not first.is_alive() and not cancel.is_alive(), outcome


def assert_the_root_fails_on_its_cancelled_child(root: Run, middle: Run) -> None:
    root.refresh_from_db()
    assert root.status == RunStatus.RUNNING and RunLock.objects.get(run_id=root.id).owner.startswith("task:")
    drive(root)  # the task the tree's wake-up booked: the root's walk finds the middle run cancelled
    assert root.status == RunStatus.FAILED, [e.kind for e in events(root)]
    assert root.error["code"] == "child_cancelled" and root.error["step_id"] == "sub"
    assert root.error["details"]["child_run_id"] == str(middle.id)


def test_a_wake_up_of_the_leaf_and_a_cancel_of_the_middle_run_both_finish(monkeypatch):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    root = tree(leaf_steps=[{"id": "review", "kind": "approval", "prompt": "ship it?"}, echo_step("shipped")])
    drive_to_end(root)  # the leaf parks on its approval, the middle run on the leaf, the root on the middle run
    middle = Run.objects.get(parent_run_id=root.id)
    leaf = Run.objects.get(parent_run_id=middle.id)
    assert {r.status for r in Run.objects.filter(id__in=[root.id, middle.id, leaf.id])} == {RunStatus.WAITING}

    locked, go_on = pause_after_booking_the_root(monkeypatch, root=root, thread="wake")
    outcome: dict = {}
    wake = _in_thread(
        lambda: approval_decide(run_id=leaf.id, step_id="review", approved=True, by="otto").id, outcome, "wake"
    )
    cancel = _in_thread(lambda: run_cancel(run_id=middle.id, by="alice", reason="not needed").status, outcome, "cancel")
    race(wake, cancel, locked, go_on, outcome)

    assert outcome == {"wake": leaf.id, "cancel": RunStatus.CANCELLED}, outcome
    middle.refresh_from_db(), leaf.refresh_from_db()
    assert (middle.status, leaf.status) == (RunStatus.CANCELLED, RunStatus.CANCELLED)  # the leaf with its parent
    assert [e.kind for e in events(leaf)][-3:] == ["approval_decided", "run_resumed", "run_cancelled"]
    assert_the_root_fails_on_its_cancelled_child(root, middle)


def test_the_leafs_ending_and_a_cancel_of_the_middle_run_both_finish(monkeypatch, settings):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    # The leaf's group has one slot, held by another run: the leaf is held back and walked later by its own task,
    # so its ending wakes its parent through run_wake (runs.walk.walk.Walk.finish), as a re-driven child's does.
    root = tree(leaf_steps=[echo_step("a"), echo_step("b")], leaf_concurrency={"max_runs": 1})
    hog, _ = run_create(workflow_name="leaf", input={})
    default_slice = settings.PAL_SLICE_SECONDS
    settings.PAL_SLICE_SECONDS = 0.000001
    drive(hog)  # takes the slot, walks one step, hands off: running
    settings.PAL_SLICE_SECONDS = default_slice
    drive_to_end(root)  # the leaf is created held back; the middle run waits on it, the root on the middle run
    middle = Run.objects.get(parent_run_id=root.id)
    leaf = Run.objects.get(parent_run_id=middle.id)
    assert (leaf.status, leaf.waiting_on["kind"]) == (RunStatus.QUEUED, "concurrency")
    drive_to_end(hog)  # its ending hands the slot to the leaf: the leaf's task is booked
    leaf_task = booked_task_id(leaf)

    locked, go_on = pause_after_booking_the_root(monkeypatch, root=root, thread="end")
    outcome: dict = {}
    ending = _in_thread(lambda: run_drive(run_id=leaf.id, task_id=leaf_task), outcome, "end")
    cancel = _in_thread(lambda: run_cancel(run_id=middle.id, by="alice", reason="not needed").status, outcome, "cancel")
    race(ending, cancel, locked, go_on, outcome)

    assert outcome == {"end": "walked", "cancel": RunStatus.CANCELLED}, outcome
    middle.refresh_from_db(), leaf.refresh_from_db()
    assert (middle.status, leaf.status) == (RunStatus.CANCELLED, RunStatus.SUCCEEDED)
    resumed = [e for e in events(middle) if e.kind == "run_resumed"]
    assert [e.payload["waited_on"]["child_run_id"] for e in resumed] == [str(leaf.id)]  # woken by the ending
    assert_the_root_fails_on_its_cancelled_child(root, middle)

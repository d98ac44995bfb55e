"""A slot handed to a held-back run at the moment an operator cancels (or re-drives) that run, on Postgres.

The hand-over holds its group's row and then books the waiting run's lease row (runs.concurrency.slot_hand_over);
a cancel of that run holds its lease row and then wants the group's row, to hand its own slot on (a re-drive, to ask
for one). Each would wait for what the other holds: the hand-over instead gives up a lease row that another
transaction is writing, after a short wait, and hands the slot to the next waiting run."""

import threading

import pytest
from django.db import connection

from runs import concurrency
from runs.models import Run, RunLock, RunStatus
from runs.services import run_cancel, run_create, run_redrive, workflow_create
from tests.helpers import drive, echo_step
from tests.services.test_wake_cancel_lock_order import _a_lock_wait_in_this_database, _in_thread

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def held_back_queue(settings, n: int) -> tuple[Run, list[Run]]:
    """A run holding the group's one slot (running) and n runs held back behind it, oldest first."""
    workflow_create(
        definition={"name": "single", "concurrency": {"max_runs": 1}, "steps": [echo_step("a"), echo_step("b")]}
    )
    default_slice = settings.PAL_SLICE_SECONDS
    settings.PAL_SLICE_SECONDS = 0.000001
    holder, _ = run_create(workflow_name="single", input={})
    drive(holder)  # takes the slot, walks one step, hands off: running
    waiting = []
    for _ in range(n):
        run, _ = run_create(workflow_name="single", input={})
        drive(run)  # no slot: held back, no lease
        waiting.append(run)
    settings.PAL_SLICE_SECONDS = default_slice
    assert [r.status for r in waiting] == [RunStatus.QUEUED] * n
    return holder, waiting


def pause_inside_the_hand_over(monkeypatch, *, thread: str):
    """Hold the named thread right after its hand-over locked the group's row, until the test lets it go on."""
    locked, go_on = threading.Event(), threading.Event()
    lock = concurrency.key_lock

    def lock_then_pause(key: str) -> None:
        lock(key)
        if threading.current_thread().name == thread and not locked.is_set():
            locked.set()
            assert go_on.wait(timeout=30), "the test never let it go on"

    monkeypatch.setattr(concurrency, "key_lock", lock_then_pause)
    return locked, go_on


def race(first: threading.Thread, second: threading.Thread, locked, go_on, outcome: dict) -> None:
    first.start()
    assert locked.wait(timeout=30), outcome
    second.start()
    for _ in range(600):  # until the second waits for a lock the first holds (or is done)
        if _a_lock_wait_in_this_database() or not second.is_alive():
            break
        second.join(timeout=0.05)
    go_on.set()
    first.join(timeout=60), second.join(timeout=60)
    assert not first.is_alive() and not second.is_alive(), outcome


def test_a_slot_handed_to_a_run_an_operator_cancels_at_that_moment_goes_to_the_next_one(monkeypatch, settings):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    holder, (first, second) = held_back_queue(settings, 2)
    locked, go_on = pause_inside_the_hand_over(monkeypatch, thread="end")
    outcome: dict = {}
    end = _in_thread(lambda: run_cancel(run_id=holder.id, by="alice", reason="done with it").status, outcome, "end")
    cancel = _in_thread(lambda: run_cancel(run_id=first.id, by="bob", reason="not needed").status, outcome, "cancel")

    race(end, cancel, locked, go_on, outcome)

    assert outcome == {"end": RunStatus.CANCELLED, "cancel": RunStatus.CANCELLED}, outcome
    first.refresh_from_db(), second.refresh_from_db()
    assert first.status == RunStatus.CANCELLED and not RunLock.objects.filter(run_id=first.id).exists()
    assert RunLock.objects.get(run_id=second.id).owner.startswith("task:")  # the slot went on to the next run
    drive(second)
    assert second.status in (RunStatus.RUNNING, RunStatus.SUCCEEDED)


def test_a_slot_handed_to_a_run_an_operator_re_drives_at_that_moment_is_taken_once(monkeypatch, settings):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    holder, (first, second) = held_back_queue(settings, 2)
    locked, go_on = pause_inside_the_hand_over(monkeypatch, thread="end")
    outcome: dict = {}
    end = _in_thread(lambda: run_cancel(run_id=holder.id, by="alice", reason="done with it").status, outcome, "end")
    redrive = _in_thread(
        lambda: run_redrive(run_id=first.id, by="bob", reason="why is it not running").status, outcome, "redrive"
    )

    race(end, redrive, locked, go_on, outcome)

    assert outcome["end"] == RunStatus.CANCELLED and outcome["redrive"] == RunStatus.QUEUED, outcome
    booked = set(RunLock.objects.filter(owner__startswith="task:").values_list("run_id", flat=True))
    assert first.id in booked  # the re-drive (or the hand-over) booked the oldest waiting run
    if second.id in booked:  # the hand-over gave up first's lease row, being written, and went to the next run
        drive(second)
        assert second.status == RunStatus.QUEUED  # an older run waits for that slot: it goes first
    drive(first)
    assert first.status in (RunStatus.RUNNING, RunStatus.SUCCEEDED)
    assert Run.objects.filter(id__in=[first.id, second.id], status=RunStatus.RUNNING).count() <= 1

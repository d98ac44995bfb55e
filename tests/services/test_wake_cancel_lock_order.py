"""A wake-up and a cancel of the same waiting run, on Postgres, at the worst moment: both take the run's lease row
(run_locks) before its status row (runs), so neither waits for the other while holding what the other needs.

Before, a wake-up locked the status row, then booked the lease row, while a cancel drops the lease row, then ends the
run: a wake-up paused between its two locks while the cancel took the lease row made Postgres find a deadlock."""

import threading

import pytest
from django.db import connection

import runs.services.wakeups as wakeups
from runs.models import RunLock, RunStatus
from runs.services import run_cancel, run_wake
from tests.helpers import drive, echo_step, events, make_run

# Row locks and deadlock detection are Postgres's: an integration test, run in make test's Postgres pass.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _in_thread(body, outcome: dict, name: str) -> threading.Thread:
    def run():
        try:
            outcome[name] = body()
        except Exception as exc:  # the deadlock Postgres breaks, or anything else: the test names it
            outcome[name] = exc
        finally:
            connection.close()  # each thread has its own connection

    return threading.Thread(target=run, name=name)


def _a_lock_wait_in_this_database() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_a_wake_up_paused_inside_its_locks_and_a_cancel_of_the_same_run_both_finish(monkeypatch):
    assert connection.vendor == "postgresql", "this test needs Postgres (DATABASE_URL): row locks and deadlocks"
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ship it?"}, echo_step("after")])
    drive(run)
    assert run.status == RunStatus.WAITING

    locked, go_on = threading.Event(), threading.Event()
    checks = wakeups._waits_on

    def pause_once_locked(waiting_on, expect):
        # Called by run_wake with its locks taken: hold them until the cancel is blocked on one of them.
        if threading.current_thread().name == "wake" and not locked.is_set():
            locked.set()
            assert go_on.wait(timeout=30), "the test never let the wake-up go on"
        return checks(waiting_on, expect)

    monkeypatch.setattr(wakeups, "_waits_on", pause_once_locked)
    outcome: dict = {}
    decision = {"approved": True, "by": "otto", "comment": "", "attempt": 1}
    wake = _in_thread(
        lambda: run_wake(
            run_id=run.id,
            by="otto",
            why="approval review approved",
            expect={"kind": "approval", "step_id": "review"},
            extra_events=[("approval_decided", decision)],
        ),
        outcome,
        "wake",
    )
    cancel = _in_thread(lambda: run_cancel(run_id=run.id, by="alice", reason="not needed").status, outcome, "cancel")
    wake.start()
    assert locked.wait(timeout=30), outcome
    cancel.start()
    for _ in range(600):  # until the cancel waits for the wake-up's lock (or, had it none to wait for, is done)
        if _a_lock_wait_in_this_database() or not cancel.is_alive():
            break
        cancel.join(timeout=0.05)
    go_on.set()
    wake.join(timeout=60), cancel.join(timeout=60)

    assert outcome == {"wake": True, "cancel": RunStatus.CANCELLED}, outcome
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert not RunLock.objects.filter(run_id=run.id).exists()  # the cancel dropped the wake-up's booking
    kinds = [e.kind for e in events(run)]
    assert kinds[-3:] == ["approval_decided", "run_resumed", "run_cancelled"]

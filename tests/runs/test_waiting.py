"""Waiting and control (issue 5, docs/reference/api.md): approvals, signals, durable timers, nested approvals
through child runs, cancel, retry from the failed step, operator re-drive and bulk actions.

Runs are driven inline in the test process (tests.helpers.drive): a wake-up (a decision, a signal, a timer)
books the run for a new task, and the next drive() is what the worker receiving that task would do.
"""

import itertools
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from journal.services import FencedOut, NewEvent, events_append
from runs import leases
from runs.models import BulkAction, BulkStatus, Run, RunLock, RunStatus, SideEffect, Signal
from runs.recovery import stuck_run_ids, sweep_once, wake_due_timers
from runs.services import (
    Conflict,
    ServiceError,
    approval_decide,
    bulk_apply,
    bulk_preview,
    bulk_start,
    run_cancel,
    run_redrive,
    run_retry,
    run_wake_timer,
    signal_send,
)
from tests.helpers import (
    LOCMEM_MAIL,
    booked_task_id,
    calls,
    drive,
    echo_step,
    events,
    kinds,
    mailer,
    make_run,
    make_workflow,
    needs_concurrent_database,
    record_drive_sends,
    step_events,
    tool_step,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet_heartbeat(monkeypatch):
    """The heartbeat thread has its own connection, which cannot see this test's uncommitted lease rows: left
    alone it would find every lease gone at its next beat. Here it reports every held lease as still held."""
    monkeypatch.setattr(leases, "lease_heartbeat", lambda owner=None: [str(r) for r in list(leases.heartbeat._held)])


@pytest.fixture(autouse=True)
def locmem_email(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)


# --- steps and helpers ------------------------------------------------------------------------------


def approval_step(step_id: str = "review", prompt: str = "Send the reply?") -> dict:
    return {"id": step_id, "kind": "approval", "prompt": prompt}


def signal_step(step_id: str, name: str) -> dict:
    return {"id": step_id, "kind": "signal", "name": name}


def sleep_step(step_id: str, seconds: float) -> dict:
    return {"id": step_id, "kind": "sleep", "seconds": seconds}


def child_step(step_id: str, workflow: str) -> dict:
    return {"id": step_id, "kind": "child_run", "workflow": workflow, "input": {}}


def email_step(step_id: str) -> dict:
    return {
        "id": step_id,
        "kind": "deliver",
        "channel": "email",
        "to": ["ops@example.com"],
        "subject": "after the cancel",
        "body": "must never leave",
    }


def output_of(run, step_id: str):
    (completed,) = step_events(run, "step_completed", step_id)
    return completed.payload["output"]


def waiting_approval_run(**extra) -> Run:
    """A run of [approval "review", echo "after"] driven until it waits on the approval."""
    run = make_run(steps=[approval_step(), echo_step("after", approved_by="{{ steps.review.output.by }}")], **extra)
    drive(run)
    assert run.status == RunStatus.WAITING, kinds(run)
    return run


def wait_past(moment, *, limit: float = 10.0) -> None:
    """Sleep until the clock has passed `moment` (a bounded wait, never a timing assertion)."""
    deadline = time.monotonic() + limit
    while timezone.now() <= moment:
        assert time.monotonic() < deadline, f"the clock never passed {moment}"
        time.sleep(0.05)


def run_in_threads(*targets):
    """Start every target at once (a barrier), each on its own connection; return what each returned or raised."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)

    def body(index, target):
        try:
            barrier.wait(timeout=10)
            results[index] = target()
        except BaseException as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a racing thread did not finish"
    return results


# --- approval ---------------------------------------------------------------------------------------


def test_an_approval_step_journals_approval_requested_and_run_waiting_with_its_prompt():
    run = waiting_approval_run()

    assert kinds(run) == ["run_created", "run_started", "step_started", "approval_requested", "run_waiting"]
    (requested,) = step_events(run, "approval_requested", "review")
    assert (requested.attempt, requested.payload) == (1, {"prompt": "Send the reply?"})


def test_a_run_waiting_on_an_approval_says_which_step_attempt_and_prompt_and_holds_no_lease():
    run = waiting_approval_run()

    assert run.waiting_on == {"kind": "approval", "step_id": "review", "attempt": 1, "prompt": "Send the reply?"}
    (waiting,) = step_events(run, "run_waiting", "review")
    assert waiting.payload == {"waiting_on": run.waiting_on}
    assert not RunLock.objects.filter(run_id=run.id).exists()
    assert run.finished_at is None


def test_approving_journals_approval_decided_with_the_user_and_comment():
    run = waiting_approval_run()

    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", comment="ship it")

    (decided,) = step_events(run, "approval_decided", "review")
    assert (decided.attempt, decided.payload) == (
        1,
        {"approved": True, "by": "alice", "comment": "ship it", "attempt": 1},
    )
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.waiting_on is None
    assert booked_task_id(run)  # booked for the task that goes on


def test_an_approved_run_goes_on_and_the_step_output_is_approved_by_and_comment():
    run = waiting_approval_run()
    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", comment="ship it")

    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    assert output_of(run, "review") == {"approved": True, "by": "alice", "comment": "ship it"}
    assert run.output == {"approved_by": "alice"}
    # The woken step went on: it did not start again.
    assert len(step_events(run, "step_started", "review")) == 1


def test_a_rejection_fails_the_step_with_approval_rejected_and_fails_the_run():
    run = waiting_approval_run()
    approval_decide(run_id=run.id, step_id="review", approved=False, by="bob", comment="wrong tone")

    drive(run)

    assert run.status == RunStatus.FAILED
    (failed,) = step_events(run, "step_failed", "review")
    assert failed.payload["code"] == "approval_rejected"
    assert failed.payload["details"] == {"by": "bob", "comment": "wrong tone"}
    assert run.error["code"] == "approval_rejected" and run.error["step_id"] == "review"
    assert step_events(run, "step_started", "after") == []


def test_deciding_an_approval_of_another_step_is_a_conflict_and_journals_nothing():
    run = waiting_approval_run()
    before = kinds(run)

    with pytest.raises(Conflict) as refused:
        approval_decide(run_id=run.id, step_id="other", approved=True, by="alice")

    assert refused.value.code == "not_waiting_on_approval"
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and kinds(run) == before


def test_deciding_an_approval_twice_is_a_conflict_the_second_time():
    run = waiting_approval_run()
    approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")

    with pytest.raises(Conflict):
        approval_decide(run_id=run.id, step_id="review", approved=False, by="bob")

    assert [e.payload["by"] for e in step_events(run, "approval_decided")] == ["alice"]


def test_deciding_an_approval_of_a_run_that_does_not_wait_is_a_conflict():
    run = make_run(steps=[approval_step()])  # queued: it has not reached its approval yet

    with pytest.raises(Conflict):
        approval_decide(run_id=run.id, step_id="review", approved=True, by="alice")

    assert step_events(run, "approval_decided") == []


@pytest.mark.django_db(transaction=True)
def test_of_two_decisions_racing_exactly_one_counts(monkeypatch):
    needs_concurrent_database()
    record_drive_sends(monkeypatch)  # committed bookings would otherwise send real tasks to the broker
    for _ in range(5):
        run = waiting_approval_run()

        results = run_in_threads(
            lambda run=run: approval_decide(run_id=run.id, step_id="review", approved=True, by="alice", comment="yes"),
            lambda run=run: approval_decide(run_id=run.id, step_id="review", approved=False, by="bob", comment="no"),
        )

        conflicts = [r for r in results if isinstance(r, Conflict)]
        wins = [r for r in results if isinstance(r, Run)]
        assert (len(wins), len(conflicts)) == (1, 1), results
        (decided,) = step_events(run, "approval_decided", "review")
        assert len(step_events(run, "run_resumed")) == 1
        drive(run)
        expected = RunStatus.SUCCEEDED if decided.payload["approved"] else RunStatus.FAILED
        assert run.status == expected


# --- signal -----------------------------------------------------------------------------------------


def test_a_signal_sent_before_the_run_waits_is_kept_and_consumed_when_the_step_is_reached():
    run = make_run(steps=[echo_step("first"), signal_step("ci", "ci-done")])
    signal = signal_send(run_id=run.id, name="ci-done", payload={"build": 42}, by="ci-bot")
    signal.refresh_from_db()
    assert signal.consumed_at is None  # kept: the run does not wait on it yet

    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    assert output_of(run, "ci") == {"build": 42}
    (received,) = step_events(run, "signal_received", "ci")
    assert received.payload == {
        "name": "ci-done",
        "payload": {"build": 42},
        "signal_id": signal.id,
        "sent_by": "ci-bot",
    }
    signal.refresh_from_db()
    assert signal.consumed_at is not None and signal.consumed_step_id == "ci"
    assert "run_waiting" not in kinds(run)


def test_a_signal_sent_before_the_run_waits_is_consumed_once_and_a_second_step_of_that_name_waits():
    run = make_run(steps=[signal_step("first", "go"), signal_step("second", "go")])
    signal_send(run_id=run.id, name="go", payload={"n": 1})

    drive(run)

    assert run.status == RunStatus.WAITING
    assert run.waiting_on == {"kind": "signal", "step_id": "second", "attempt": 1, "name": "go"}
    assert [e.step_id for e in step_events(run, "signal_received")] == ["first"]
    assert list(Signal.objects.filter(run_id=run.id).values_list("consumed_step_id", flat=True)) == ["first"]
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_a_signal_sent_after_the_run_waits_wakes_it_and_is_consumed_once():
    run = make_run(steps=[signal_step("ci", "ci-done"), echo_step("after", build="{{ steps.ci.output.build }}")])
    drive(run)
    assert run.status == RunStatus.WAITING
    assert run.waiting_on == {"kind": "signal", "step_id": "ci", "attempt": 1, "name": "ci-done"}

    signal = signal_send(run_id=run.id, name="ci-done", payload={"build": 7}, by="ci-bot")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # woken and booked for a task
    drive(run)

    assert run.status == RunStatus.SUCCEEDED and run.output == {"build": 7}
    assert len(step_events(run, "signal_received", "ci")) == 1
    signal.refresh_from_db()
    assert signal.consumed_at is not None and signal.consumed_step_id == "ci"


def test_a_signal_of_another_name_does_not_wake_the_run_and_is_kept():
    run = make_run(steps=[signal_step("ci", "ci-done")])
    drive(run)

    signal = signal_send(run_id=run.id, name="deploy-done", payload={})

    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and not RunLock.objects.filter(run_id=run.id).exists()
    signal.refresh_from_db()
    assert signal.consumed_at is None


def test_two_signals_of_the_same_name_feed_two_signal_steps_in_the_order_sent():
    run = make_run(steps=[signal_step("first", "tick"), signal_step("second", "tick")])
    signal_send(run_id=run.id, name="tick", payload={"n": 1})
    signal_send(run_id=run.id, name="tick", payload={"n": 2})

    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    assert (output_of(run, "first"), output_of(run, "second")) == ({"n": 1}, {"n": 2})
    consumed = Signal.objects.filter(run_id=run.id).order_by("id").values_list("payload", "consumed_step_id")
    assert list(consumed) == [({"n": 1}, "first"), ({"n": 2}, "second")]


def test_two_signals_sent_one_at_a_time_to_a_waiting_run_feed_its_two_steps_in_order():
    run = make_run(steps=[signal_step("first", "tick"), signal_step("second", "tick")])
    drive(run)
    signal_send(run_id=run.id, name="tick", payload={"n": 1})
    drive(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "second"

    signal_send(run_id=run.id, name="tick", payload={"n": 2})
    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    assert (output_of(run, "first"), output_of(run, "second")) == ({"n": 1}, {"n": 2})
    assert [e.step_id for e in step_events(run, "signal_received")] == ["first", "second"]


def test_a_signal_to_a_run_that_has_ended_is_refused_and_not_kept():
    run = make_run(steps=[echo_step("only")])
    drive(run)

    with pytest.raises(Conflict) as refused:
        signal_send(run_id=run.id, name="late", payload={})

    assert refused.value.code == "run_ended"
    assert not Signal.objects.filter(run_id=run.id).exists()


# --- sleep (a durable timer) ------------------------------------------------------------------------


def test_a_sleep_step_parks_the_run_with_a_wake_time_and_holds_no_lease():
    run = make_run(steps=[sleep_step("nap", 60), echo_step("after")])

    drive(run)

    assert run.status == RunStatus.WAITING
    assert run.waiting_on["kind"] == "timer"
    assert (run.waiting_on["step_id"], run.waiting_on["attempt"]) == ("nap", 1)
    assert parse_datetime(run.waiting_on["until"]) == run.wake_at
    assert run.wake_at > timezone.now()
    assert not RunLock.objects.filter(run_id=run.id).exists()
    assert kinds(run)[-1] == "run_waiting"


def test_waking_a_timer_before_its_time_does_nothing():
    run = make_run(steps=[sleep_step("nap", 60), echo_step("after")])
    drive(run)
    before = kinds(run)

    assert run_wake_timer(run_id=run.id) is False

    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.wake_at is not None
    assert kinds(run) == before
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_a_timer_woken_after_its_time_lets_the_run_go_on_and_the_step_output_is_slept_seconds():
    run = make_run(steps=[sleep_step("nap", 0.5), echo_step("after", done=True)])
    drive(run)
    wait_past(run.wake_at)

    assert run_wake_timer(run_id=run.id) is True
    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    assert output_of(run, "nap") == {"slept": 0.5}
    assert run.output == {"done": True}
    assert run.wake_at is None
    assert len(step_events(run, "step_started", "nap")) == 1


def test_the_sweep_wakes_a_due_timer_whose_wake_up_task_was_lost():
    run = make_run(steps=[sleep_step("nap", 0.5), echo_step("after", done=True)])
    drive(run)  # the wake-up task was never sent: on_commit does not fire in this test's transaction
    wait_past(run.wake_at)

    record = sweep_once()

    assert record.woken == [str(run.id)]
    assert str(run.id) not in record.redriven
    drive(run)
    assert run.status == RunStatus.SUCCEEDED and output_of(run, "nap") == {"slept": 0.5}


def test_wake_due_timers_leaves_a_timer_that_is_not_due():
    run = make_run(steps=[sleep_step("nap", 60)])
    drive(run)

    assert wake_due_timers() == []

    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


@pytest.mark.parametrize(
    "step", [approval_step(), signal_step("ci", "ci-done"), sleep_step("nap", 60)], ids=["approval", "signal", "timer"]
)
def test_the_sweep_never_redrives_a_waiting_run(step):
    run = make_run(steps=[step])
    drive(run)
    assert run.status == RunStatus.WAITING

    record = sweep_once()

    assert run.id not in stuck_run_ids()
    assert str(run.id) not in record.redriven and str(run.id) not in record.woken
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert "run_redriven" not in kinds(run)
    assert not RunLock.objects.filter(run_id=run.id).exists()


# --- nested approvals through child runs -------------------------------------------------------------


def approval_tree():
    """root -> child -> grandchild -> great-grandchild, whose approval the whole tree waits on.
    Returns the runs from the root down, driven until they all wait."""
    deepest = make_workflow(
        steps=[approval_step("sign", "Sign the release?"), echo_step("result", signed_by="{{ steps.sign.output.by }}")]
    )
    grandchild = make_workflow(steps=[child_step("sub", deepest.name)])
    child = make_workflow(steps=[child_step("sub", grandchild.name)])
    root = make_run(steps=[child_step("sub", child.name)])
    drive(root)
    tree = [root]
    while len(tree) < 4:
        (below,) = Run.objects.filter(parent_run_id=tree[-1].id)
        tree.append(below)
    return tree


def test_a_child_waiting_on_an_approval_makes_every_ancestor_wait_on_its_child():
    tree = approval_tree()

    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.WAITING] * 4
    assert [r.depth for r in tree] == [0, 1, 2, 3]
    for parent, child in itertools.pairwise(tree):
        assert parent.waiting_on["kind"] == "child"
        assert (parent.waiting_on["step_id"], parent.waiting_on["child_run_id"]) == ("sub", str(child.id))
    assert tree[-1].waiting_on == {"kind": "approval", "step_id": "sign", "attempt": 1, "prompt": "Sign the release?"}
    assert not RunLock.objects.filter(run_id__in=[r.id for r in tree]).exists()


def test_the_root_waiting_on_its_child_says_what_the_child_waits_on():
    root, child, *_ = approval_tree()

    root.refresh_from_db()
    assert root.waiting_on["child_waiting_on"]["kind"] == "child"
    child.refresh_from_db()
    assert root.waiting_on["child_waiting_on"] == child.waiting_on


def test_approving_the_deepest_run_resumes_every_ancestor_and_the_root_finishes_with_its_output():
    tree = approval_tree()
    root, deepest = tree[0], tree[-1]

    approval_decide(run_id=deepest.id, step_id="sign", approved=True, by="carol", comment="go")
    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.RUNNING] * 4
    assert [bool(step_events(r, "run_resumed")) for r in tree] == [True] * 4
    drive(root)  # the root's task: its walk adopts the woken child, which goes on down to the approval

    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.SUCCEEDED] * 4
    assert deepest.output == {"signed_by": "carol"}
    assert [r.output for r in tree] == [{"signed_by": "carol"}] * 4
    assert output_of(deepest, "sign") == {"approved": True, "by": "carol", "comment": "go"}
    # No run of the tree created a second child or started its step again.
    assert Run.objects.filter(parent_run_id__in=[r.id for r in tree]).count() == 3
    assert all(len(step_events(r, "step_started", "sub")) == 1 for r in tree[:3])


def test_rejecting_the_deepest_approval_fails_every_run_of_the_tree():
    tree = approval_tree()

    approval_decide(run_id=tree[-1].id, step_id="sign", approved=False, by="carol", comment="no")
    drive(tree[0])

    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.FAILED] * 4
    assert tree[-1].error["code"] == "approval_rejected"
    assert [r.error["code"] for r in tree[:3]] == ["child_failed"] * 3


def test_a_signal_to_a_waiting_child_resumes_the_child_and_then_its_parent():
    child_wf = make_workflow(steps=[signal_step("ci", "ci-done")])
    parent = make_run(
        steps=[child_step("sub", child_wf.name), echo_step("after", build="{{ steps.sub.output.build }}")]
    )
    drive(parent)
    (child,) = Run.objects.filter(parent_run_id=parent.id)
    assert parent.waiting_on["kind"] == "child" and parent.waiting_on["child_run_id"] == str(child.id)

    signal_send(run_id=child.id, name="ci-done", payload={"build": 9})
    drive(parent)

    child.refresh_from_db()
    assert (parent.status, child.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)
    assert parent.output == {"build": 9}


# --- cancel -----------------------------------------------------------------------------------------


def test_cancelling_a_waiting_run_cancels_it_and_journals_who_and_why():
    run = waiting_approval_run()

    run_cancel(run_id=run.id, by="alice", reason="customer withdrew")

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    assert run.waiting_on is None and run.wake_at is None
    last = events(run)[-1]
    assert (last.kind, last.payload) == (
        "run_cancelled",
        {"by": "alice", "reason": "customer withdrew", "who": "alice", "why": "customer withdrew"},
    )


def test_an_approval_of_a_cancelled_run_is_a_conflict():
    run = waiting_approval_run()
    run_cancel(run_id=run.id, by="alice", reason="customer withdrew")

    with pytest.raises(Conflict):
        approval_decide(run_id=run.id, step_id="review", approved=True, by="bob")

    assert step_events(run, "approval_decided") == []


def test_cancelling_a_sleeping_run_clears_its_timer_so_the_sweep_never_wakes_it():
    run = make_run(steps=[sleep_step("nap", 0.5), echo_step("after")])
    drive(run)
    wake_at = run.wake_at
    run_cancel(run_id=run.id, by="alice", reason="no longer needed")
    wait_past(wake_at)

    record = sweep_once()

    assert str(run.id) not in record.woken and str(run.id) not in record.redriven
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.wake_at is None
    assert step_events(run, "step_completed") == []


def test_cancelling_the_root_of_a_waiting_tree_cancels_every_descendant_with_who_and_why():
    tree = approval_tree()
    root = tree[0]

    run_cancel(run_id=root.id, by="alice", reason="release called off")

    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.CANCELLED] * 4
    assert all(r.finished_at is not None and r.waiting_on is None for r in tree)
    for parent, run in zip([None, *tree[:-1]], tree, strict=True):
        (cancelled,) = step_events(run, "run_cancelled")
        assert cancelled.payload["by"] == "alice"
        assert "release called off" in cancelled.payload["reason"]
        if parent is not None:
            assert str(parent.id) in cancelled.payload["reason"]
    with pytest.raises(Conflict):
        approval_decide(run_id=tree[-1].id, step_id="sign", approved=True, by="bob")


def test_cancelling_only_the_deepest_waiting_child_does_not_leave_its_ancestors_waiting_forever():
    tree = approval_tree()
    root, deepest = tree[0], tree[-1]

    run_cancel(run_id=deepest.id, by="alice", reason="drop the signature")
    for run in tree[:3]:
        run.refresh_from_db()
    # Nothing else would ever wake them: the sweep never re-drives a waiting run.
    assert [r.status for r in tree[:3]] == [RunStatus.RUNNING] * 3, [r.waiting_on for r in tree[:3]]
    drive(root)

    for run in tree:
        run.refresh_from_db()
    assert [r.status for r in tree] == [RunStatus.FAILED] * 3 + [RunStatus.CANCELLED]
    assert tree[2].error["code"] == "child_cancelled"
    assert tree[2].error["details"]["child_run_id"] == str(deepest.id)
    assert [r.error["code"] for r in tree[:2]] == ["child_failed"] * 2
    assert not RunLock.objects.filter(run_id__in=[r.id for r in tree]).exists()


def test_a_deliver_step_after_a_cancel_point_is_never_claimed(mailoutbox):
    run = make_run(steps=[tool_step("stop", "test_cancel"), email_step("mail")])

    assert drive(run) == "fenced"

    assert run.status == RunStatus.CANCELLED
    assert not SideEffect.objects.filter(run_id=run.id).exists()
    assert "side_effect_claimed" not in kinds(run)
    assert step_events(run, "step_started", "mail") == []
    assert mailoutbox == []


def test_a_deliver_step_after_an_approval_of_a_cancelled_run_is_never_claimed(mailoutbox):
    run = make_run(steps=[approval_step(), email_step("mail")])
    drive(run)
    run_cancel(run_id=run.id, by="alice", reason="not this one")

    sweep_once()  # nothing to recover: the run has ended

    assert not SideEffect.objects.filter(run_id=run.id).exists()
    assert mailoutbox == []
    assert kinds(run)[-1] == "run_cancelled"


# --- retry from the failed step ---------------------------------------------------------------------


def failed_run() -> Run:
    """[first (counted), flaky (fails until attempt 2), last (counted)] driven until it failed in flaky."""
    run = make_run(
        steps=[
            tool_step("first", "test_count", {"n": 1}),
            tool_step("flaky", "test_fail_before", {"succeed_on": 2}),
            tool_step("last", "test_count", {"n": 3}),
        ]
    )
    drive(run)
    assert run.status == RunStatus.FAILED and run.error["step_id"] == "flaky"
    return run


def test_a_retried_run_goes_on_from_its_failed_step_with_the_next_attempt_and_succeeds():
    run = failed_run()

    retried = run_retry(run_id=run.id, by="bob", reason="upstream fixed")
    assert retried.status == RunStatus.RUNNING and retried.error is None
    drive(run)

    assert run.status == RunStatus.SUCCEEDED and run.output == {"n": 3}
    assert [e.attempt for e in step_events(run, "step_started", "flaky")] == [1, 2]
    assert [e.attempt for e in step_events(run, "step_completed", "flaky")] == [2]


def test_a_retry_makes_a_new_key_for_the_failed_step_only():
    run = failed_run()
    run_retry(run_id=run.id, by="bob", reason="upstream fixed")
    drive(run)

    assert [c["key"] for c in calls(run, "flaky")] == [f"{run.id}:flaky:1", f"{run.id}:flaky:2"]
    assert [c["key"] for c in calls(run, "last")] == [f"{run.id}:last:1"]
    started = step_events(run, "step_started", "flaky")[-1]
    assert started.payload["key"].endswith(":2") and started.payload["key"] == f"{run.id}:flaky:2"


def test_a_retry_does_not_execute_the_steps_before_the_failed_one_again():
    run = failed_run()
    run_retry(run_id=run.id, by="bob", reason="upstream fixed")
    drive(run)

    assert [c["key"] for c in calls(run, "first")] == [f"{run.id}:first:1"]
    assert len(step_events(run, "step_started", "first")) == 1


def test_a_retry_journals_run_retried_with_who_why_and_the_new_attempt():
    run = failed_run()

    run_retry(run_id=run.id, by="bob", reason="upstream fixed")

    (retried,) = step_events(run, "run_retried")
    assert (retried.step_id, retried.attempt) == ("flaky", 2)
    assert (retried.payload["who"], retried.payload["why"], retried.payload["failed_attempt"]) == (
        "bob",
        "upstream fixed",
        1,
    )


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_retry_needs_a_reason(reason):
    run = failed_run()

    with pytest.raises(ServiceError) as refused:
        run_retry(run_id=run.id, by="bob", reason=reason)

    assert refused.value.code == "reason_required"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "run_retried" not in kinds(run)


@pytest.mark.parametrize("state", ["succeeded", "waiting", "cancelled"])
def test_retrying_a_run_that_has_not_failed_is_a_conflict(state):
    run = make_run(steps=[approval_step() if state == "waiting" else echo_step("only")])
    if state == "cancelled":
        run_cancel(run_id=run.id, by="alice", reason="stop")
    else:
        drive(run)
    before = kinds(run)

    with pytest.raises(Conflict) as refused:
        run_retry(run_id=run.id, by="bob", reason="try again")

    assert refused.value.code == "run_not_failed"
    assert kinds(run) == before


# --- operator re-drive ------------------------------------------------------------------------------


def held_run():
    """A run whose booked task a worker has taken: a live lease. Returns (run, the holder's fence)."""
    run = make_run(steps=[echo_step("only", ok=True)])
    fence = leases.lease_acquire(run_id=run.id, task_id=booked_task_id(run))
    leases.heartbeat.untrack(fence)  # no beating needed here: the lease is live for PAL_LEASE_TTL
    assert fence is not None
    return run, fence


def test_a_redrive_is_refused_while_a_live_lease_holds_the_run():
    run, fence = held_run()

    with pytest.raises(Conflict) as refused:
        run_redrive(run_id=run.id, by="oscar", reason="looks stuck")

    assert refused.value.code == "lease_held"
    lock = RunLock.objects.get(run_id=run.id)
    assert (lock.owner, lock.epoch) == (fence.owner, fence.epoch)
    assert "run_redriven" not in kinds(run)


def test_a_forced_redrive_steals_the_lease_with_a_new_epoch_and_fences_the_old_holder():
    run, fence = held_run()

    run_redrive(run_id=run.id, by="oscar", reason="the worker is frozen", force=True)

    lock = RunLock.objects.get(run_id=run.id)
    assert lock.epoch == fence.epoch + 1 and lock.owner != fence.owner
    with pytest.raises(FencedOut):
        events_append(run_id=run.id, events=[NewEvent("late_write", payload={})], writer=fence.owner, fence=fence)
    assert "late_write" not in kinds(run)


def test_a_forced_redrive_journals_run_redriven_with_who_why_and_the_stolen_lease():
    run, fence = held_run()

    run_redrive(run_id=run.id, by="oscar", reason="the worker is frozen", force=True)

    (redriven,) = step_events(run, "run_redriven")
    assert (redriven.payload["who"], redriven.payload["why"], redriven.payload["force"]) == (
        "oscar",
        "the worker is frozen",
        True,
    )
    assert (redriven.payload["previous_lease"]["owner"], redriven.payload["previous_lease"]["epoch"]) == (
        fence.owner,
        fence.epoch,
    )


def test_the_task_of_a_forced_redrive_finishes_the_run():
    run, _ = held_run()
    run_redrive(run_id=run.id, by="oscar", reason="the worker is frozen", force=True)

    drive(run)

    assert run.status == RunStatus.SUCCEEDED and run.output == {"ok": True}


def test_a_redrive_needs_a_reason():
    run, _ = held_run()

    with pytest.raises(ServiceError) as refused:
        run_redrive(run_id=run.id, by="oscar", reason=" ", force=True)

    assert refused.value.code == "reason_required"
    assert "run_redriven" not in kinds(run)


def test_a_redrive_of_a_run_that_has_ended_is_a_conflict():
    run = make_run(steps=[echo_step("only")])
    drive(run)

    with pytest.raises(Conflict):
        run_redrive(run_id=run.id, by="oscar", reason="again", force=True)

    assert kinds(run)[-1] == "run_succeeded"


# --- bulk actions -----------------------------------------------------------------------------------


@pytest.fixture
def runs_in_every_state():
    """Runs of one workflow [approval, echo] in each status; returns (workflow, {status: run})."""
    workflow = make_workflow(steps=[approval_step(), echo_step("after", ok=True)])
    made = {}
    made["queued"] = make_run(workflow=workflow)
    made["waiting"] = make_run(workflow=workflow)
    drive(made["waiting"])
    made["succeeded"] = make_run(workflow=workflow)
    drive(made["succeeded"])
    approval_decide(run_id=made["succeeded"].id, step_id="review", approved=True, by="alice")
    drive(made["succeeded"])
    made["failed"] = make_run(workflow=workflow)
    drive(made["failed"])
    approval_decide(run_id=made["failed"].id, step_id="review", approved=False, by="alice")
    drive(made["failed"])
    made["cancelled"] = make_run(workflow=workflow)
    run_cancel(run_id=made["cancelled"].id, by="alice", reason="stop")
    for status, run in made.items():
        run.refresh_from_db()
        assert run.status == status
    make_run(steps=[approval_step()])  # another workflow's run: never matches the filter
    return workflow, made


def test_a_bulk_cancel_preview_counts_only_the_unfinished_runs_that_match(runs_in_every_state):
    workflow, made = runs_in_every_state

    preview = bulk_preview(action="cancel", filters={"workflow": workflow.name})

    assert preview["count"] == 2 and preview["truncated"] is False
    assert set(preview["sample"]) == {str(made["queued"].id), str(made["waiting"].id)}


def test_a_bulk_retry_preview_counts_only_the_failed_runs_that_match(runs_in_every_state):
    workflow, made = runs_in_every_state

    preview = bulk_preview(action="retry", filters={"workflow": workflow.name})

    assert (preview["count"], preview["sample"]) == (1, [str(made["failed"].id)])


def test_a_bulk_cancel_cancels_each_matching_run_with_the_operator_and_reason_journaled(runs_in_every_state):
    workflow, made = runs_in_every_state
    bulk = bulk_start(action="cancel", filters={"workflow": workflow.name}, reason="customer left", by="olga")
    assert (bulk.total, bulk.status, bulk.done, bulk.failed) == (2, BulkStatus.PENDING, 0, 0)

    bulk_apply(bulk_id=bulk.id)

    for status in ("queued", "waiting"):
        run = made[status]
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED
        last = events(run)[-1]
        assert (last.kind, last.payload, last.writer) == (
            "run_cancelled",
            {"by": "olga", "reason": "customer left", "who": "olga", "why": "customer left"},
            "olga",
        )
    for status in ("succeeded", "failed", "cancelled"):
        made[status].refresh_from_db()
        assert made[status].status == status
        assert [e.payload["by"] for e in step_events(made[status], "run_cancelled")] in ([], ["alice"])


def test_bulk_progress_ends_done_with_every_run_counted(runs_in_every_state):
    workflow, _ = runs_in_every_state
    bulk = bulk_start(action="cancel", filters={"workflow": workflow.name}, reason="customer left", by="olga")

    bulk_apply(bulk_id=bulk.id)

    bulk.refresh_from_db()
    assert (bulk.status, bulk.total, bulk.done, bulk.failed, bulk.errors) == (BulkStatus.DONE, 2, 2, 0, [])
    assert bulk.finished_at is not None


def test_a_run_that_refuses_the_bulk_action_is_counted_in_failed_with_its_detail(runs_in_every_state):
    workflow, made = runs_in_every_state
    bulk = bulk_start(action="cancel", filters={"workflow": workflow.name}, reason="customer left", by="olga")
    run_cancel(run_id=made["waiting"].id, by="alice", reason="got there first")  # it ends before the task runs

    bulk_apply(bulk_id=bulk.id)

    bulk.refresh_from_db()
    assert (bulk.status, bulk.total, bulk.done, bulk.failed) == (BulkStatus.DONE, 2, 1, 1)
    (error,) = bulk.errors
    assert (error["run_id"], error["code"]) == (str(made["waiting"].id), "run_ended")
    assert "already ended" in error["detail"]
    assert [e.payload["by"] for e in step_events(made["waiting"], "run_cancelled")] == ["alice"]


def test_a_bulk_action_applied_twice_acts_once(runs_in_every_state):
    workflow, made = runs_in_every_state
    bulk = bulk_start(action="cancel", filters={"workflow": workflow.name}, reason="customer left", by="olga")

    bulk_apply(bulk_id=bulk.id)
    bulk_apply(bulk_id=bulk.id)  # a second delivery of the task

    bulk.refresh_from_db()
    assert (bulk.done, bulk.failed) == (2, 0)
    assert len(step_events(made["queued"], "run_cancelled")) == 1


def test_a_bulk_retry_retries_each_failed_run_with_the_operator_and_reason(runs_in_every_state):
    workflow, made = runs_in_every_state
    bulk = bulk_start(action="retry", filters={"workflow": workflow.name}, reason="new reviewer", by="olga")

    bulk_apply(bulk_id=bulk.id)

    bulk.refresh_from_db()
    assert (bulk.status, bulk.total, bulk.done, bulk.failed) == (BulkStatus.DONE, 1, 1, 0)
    run = made["failed"]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    (retried,) = step_events(run, "run_retried")
    assert (retried.step_id, retried.attempt, retried.payload["who"], retried.payload["why"]) == (
        "review",
        2,
        "olga",
        "new reviewer",
    )


def test_a_bulk_action_needs_a_reason(runs_in_every_state):
    workflow, _ = runs_in_every_state

    with pytest.raises(ServiceError) as refused:
        bulk_start(action="cancel", filters={"workflow": workflow.name}, reason="", by="olga")

    assert refused.value.code == "reason_required"
    assert not BulkAction.objects.exists()


def test_an_unknown_bulk_action_is_refused():
    with pytest.raises(ServiceError) as refused:
        bulk_preview(action="explode", filters={})
    assert refused.value.code == "invalid_action"

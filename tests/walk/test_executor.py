"""The walk over a run's steps, driven inline as a worker would drive it (docs/reference/keys.md, journal.md)."""

import pytest

from journal.services import NewEvent
from runs import leases
from runs.models import RunLock, RunStatus, SideEffect, SideEffectStatus
from runs.services import Conflict, run_cancel
from runs.steps.deliver import message_id_for
from runs.walk import run_drive
from tests.helpers import (
    CRASHING_MAIL,
    LOCMEM_MAIL,
    booked_task_id,
    calls,
    drive,
    drive_to_end,
    echo_step,
    events,
    journal_by_hand,
    kinds,
    mailer,
    make_run,
    record_drive_sends,
    step_events,
    sweep_after_expiry,
    tool_step,
)

pytestmark = pytest.mark.django_db


def llm_step(step_id, prompt):
    return {"id": step_id, "kind": "llm_call", "provider": "fake", "model": "gpt-4o-mini", "prompt": prompt}


def email_step(step_id, body="{{ steps.draft.output.text }}"):
    return {
        "id": step_id,
        "kind": "deliver",
        "channel": "email",
        "to": ["ops@example.com"],
        "subject": "Ticket {{ input.id }}",
        "body": body,
    }


THREE_KINDS = [
    echo_step("lookup", customer="{{ input.customer }}", id="{{ input.id }}"),
    llm_step("draft", "Reply to {{ steps.lookup.output.customer }}"),
    email_step("mail"),
]


@pytest.fixture(autouse=True)
def locmem_email(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)


# --- a run that goes well -------------------------------------------------------------------------


def test_a_run_of_echo_llm_and_email_steps_succeeds_inline(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    assert drive(run) == "walked"
    assert run.status == RunStatus.SUCCEEDED
    assert run.started_at is not None and run.finished_at is not None
    assert not RunLock.objects.filter(run_id=run.id).exists()
    assert [m.subject for m in mailoutbox] == ["Ticket 7"]


def test_the_run_output_is_the_last_steps_output(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    drive(run)
    assert run.output == {"channel": "email", "key": f"{run.id}:mail:1", "status": "delivered"}
    assert step_events(run, "run_succeeded")[0].payload == {"output": run.output}


def test_the_journal_records_the_run_step_by_step_in_order(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    drive(run)
    assert [(e.kind, e.step_id) for e in events(run)] == [
        ("run_created", None),
        ("run_started", None),
        ("step_started", "lookup"),
        ("step_completed", "lookup"),
        ("step_started", "draft"),
        ("step_completed", "draft"),
        ("step_started", "mail"),
        ("side_effect_claimed", "mail"),
        ("side_effect_delivered", "mail"),
        ("step_completed", "mail"),
        ("run_succeeded", None),
    ]
    assert [e.seq for e in events(run)] == list(range(1, 12))


def test_each_step_starts_with_attempt_one_and_the_key_run_step_attempt(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    drive(run)
    started = step_events(run, "step_started")
    assert [(e.step_id, e.attempt, e.payload["key"]) for e in started] == [
        ("lookup", 1, f"{run.id}:lookup:1"),
        ("draft", 1, f"{run.id}:draft:1"),
        ("mail", 1, f"{run.id}:mail:1"),
    ]


def test_step_completed_holds_the_full_output_and_feeds_later_templates(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    drive(run)
    lookup = step_events(run, "step_completed", "lookup")[0].payload["output"]
    draft = step_events(run, "step_completed", "draft")[0].payload["output"]
    assert lookup == {"customer": "Ada", "id": 7}  # a whole template keeps the JSON type of input.id
    assert draft["text"].endswith("Reply to Ada")
    assert set(draft) == {"text", "model", "usage", "cost_usd"}
    assert mailoutbox[0].body == draft["text"]


def test_an_email_carries_a_message_id_derived_from_its_key(mailoutbox):
    run = make_run(steps=THREE_KINDS, input={"customer": "Ada", "id": 7})
    drive(run)
    key = f"{run.id}:mail:1"
    assert mailoutbox[0].extra_headers["Message-ID"] == message_id_for(key)
    assert SideEffect.objects.get(key=key).status == SideEffectStatus.DELIVERED


def test_a_tool_receives_the_attempts_key():
    run = make_run(steps=[tool_step("a", "test_count", {"x": 1})])
    drive(run)
    assert calls(run) == [{"step_id": "a", "attempt": 1, "key": f"{run.id}:a:1", "resumed": False, "args": {"x": 1}}]


# --- re-drive after a crash -----------------------------------------------------------------------

CRASH_IN_B = [
    tool_step("a", "test_count", {"n": 1}),
    tool_step("b", "test_crash_once", {"n": 2}),
    tool_step("c", "test_count", {"n": 3}),
]


def crashed_in_b():
    """A run whose worker died in step b: a's step_completed and b's step_started are journaled."""
    run = make_run(steps=CRASH_IN_B)
    with pytest.raises(BaseException, match="crash in b"):
        drive(run)
    run.refresh_from_db()
    assert kinds(run)[-1] == "step_started" and events(run)[-1].step_id == "b"
    sweep_after_expiry(run)
    return run


def test_a_redrive_after_a_crash_reuses_completed_steps_without_calling_them_again():
    run = crashed_in_b()
    drive(run)
    assert run.status == RunStatus.SUCCEEDED
    assert len(calls(run, "a")) == 1
    assert len(step_events(run, "step_started", "a")) == 1


def test_a_redrive_reexecutes_the_interrupted_step_with_the_same_attempt_and_key():
    run = crashed_in_b()
    drive(run)
    assert [(c["attempt"], c["key"], c["resumed"]) for c in calls(run, "b")] == [
        (1, f"{run.id}:b:1", False),
        (1, f"{run.id}:b:1", True),
    ]


def test_a_redrive_journals_the_restart_of_the_interrupted_attempt_as_resumed():
    run = crashed_in_b()
    drive(run)
    key = f"{run.id}:b:1"
    assert [
        (e.kind, e.attempt, e.payload.get("key"), e.payload.get("resumed")) for e in events(run) if e.step_id == "b"
    ] == [
        ("step_started", 1, key, None),
        ("step_started", 1, key, True),
        ("step_completed", 1, None, None),
    ]


def test_the_redriven_walk_uses_the_stored_output_of_completed_steps():
    run = make_run(steps=[tool_step("a", "test_count", {"v": "first"}), echo_step("b", got="{{ steps.a.output.v }}")])
    journal_by_hand(
        run,
        NewEvent("run_started"),
        NewEvent("step_started", "a", 1, {"key": f"{run.id}:a:1", "kind": "tool_call"}),
        NewEvent("step_completed", "a", 1, {"output": {"v": "from the journal"}}),
    )
    drive(run)
    assert calls(run, "a") == []
    assert run.output == {"got": "from the journal"}


def test_a_step_started_without_outcome_journaled_by_hand_is_reexecuted_with_its_attempt():
    run = make_run(steps=[tool_step("a", "test_count")])
    journal_by_hand(
        run,
        NewEvent("run_started"),
        NewEvent("step_started", "a", 2, {"key": f"{run.id}:a:2", "kind": "tool_call"}),
    )
    drive(run)
    assert [(c["attempt"], c["key"], c["resumed"]) for c in calls(run)] == [(2, f"{run.id}:a:2", True)]
    assert run.status == RunStatus.SUCCEEDED


# --- failures and retries -------------------------------------------------------------------------


def test_a_definite_failure_is_retried_up_to_max_attempts_with_a_new_key_each_time():
    run = make_run(steps=[tool_step("a", "test_fail", retry={"max_attempts": 3, "backoff_seconds": 0})])
    drive(run)
    assert [c["key"] for c in calls(run)] == [f"{run.id}:a:1", f"{run.id}:a:2", f"{run.id}:a:3"]
    assert [(e.kind, e.attempt) for e in events(run) if e.step_id == "a"] == [
        ("step_started", 1),
        ("step_failed", 1),
        ("step_started", 2),
        ("step_failed", 2),
        ("step_started", 3),
        ("step_failed", 3),
        ("run_failed", 3),
    ]


def test_the_run_fails_when_its_last_attempt_fails():
    run = make_run(steps=[tool_step("a", "test_fail", retry={"max_attempts": 3}), tool_step("b", "test_count")])
    drive(run)
    assert run.status == RunStatus.FAILED
    assert run.error == {
        "step_id": "a",
        "attempt": 3,
        "message": "the test tool refuses",
        "code": "test_refused",
        "permanent": True,
    }
    assert kinds(run)[-1] == "run_failed"
    assert calls(run, "b") == []
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_a_step_that_succeeds_on_a_retry_lets_the_run_go_on():
    run = make_run(
        steps=[tool_step("a", "test_fail_before", {"succeed_on": 2}, retry={"max_attempts": 3}), echo_step("b")]
    )
    drive(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["attempt"] for c in calls(run, "a")] == [1, 2]


def test_a_step_without_a_retry_policy_has_one_attempt():
    run = make_run(steps=[tool_step("a", "test_fail")])
    drive(run)
    assert run.status == RunStatus.FAILED
    assert len(calls(run)) == 1


def test_a_failure_with_backoff_hands_the_run_to_a_delayed_task_and_the_next_attempt_follows(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = record_drive_sends(monkeypatch)
    run = make_run(
        steps=[tool_step("a", "test_fail_before", {"succeed_on": 2}, retry={"max_attempts": 2, "backoff_seconds": 30})]
    )
    with django_capture_on_commit_callbacks(execute=True):
        drive(run)
    assert run.status == RunStatus.RUNNING
    assert kinds(run)[-2:] == ["step_failed", "run_backoff"]
    assert sent == [{"run_id": str(run.id), "task_id": booked_task_id(run), "countdown": 30.0}]
    drive(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["key"] for c in calls(run)] == [f"{run.id}:a:1", f"{run.id}:a:2"]


def test_a_tool_raising_an_unexpected_exception_fails_the_step_with_internal_error():
    run = make_run(steps=[tool_step("a", "test_boom")])
    assert drive(run) == "walked"
    failed = step_events(run, "step_failed", "a")[0].payload
    assert failed["code"] == "internal_error"
    assert failed["message"] == "ZeroDivisionError: division by zero in a tool"
    assert run.status == RunStatus.FAILED


def test_a_template_reading_a_missing_input_fails_the_step_with_template_error():
    run = make_run(steps=[echo_step("a", name="{{ input.customer.name }}")], input={"other": 1})
    drive(run)
    failed = step_events(run, "step_failed", "a")[0].payload
    assert failed["code"] == "template_error"
    assert "input.customer" in failed["message"]


def test_an_unknown_outcome_is_retried_inside_the_same_attempt_with_the_same_key():
    # docs/reference/keys.md (Attempts): only a definite failure is journaled step_failed at once; an outcome
    # that is unknown is retried inside the same attempt with the same key.
    run = make_run(steps=[tool_step("a", "test_unknown_once", retry={"max_attempts": 2})])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert step_events(run, "step_failed") == []
    assert {c["key"] for c in calls(run)} == {f"{run.id}:a:1"}


# --- slices ---------------------------------------------------------------------------------------


def test_a_drive_past_its_slice_hands_the_run_to_a_new_task(settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.PAL_SLICE_SECONDS = 1e-9
    sent = record_drive_sends(monkeypatch)
    run = make_run(steps=[echo_step("a"), echo_step("b"), echo_step("c")])
    first_task = booked_task_id(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert drive(run) == "walked"
    assert run.status == RunStatus.RUNNING
    lock = RunLock.objects.get(run_id=run.id)
    assert lock.owner.startswith("task:") and lock.owner != f"task:{first_task}"
    assert sent == [{"run_id": str(run.id), "task_id": lock.owner.removeprefix("task:"), "countdown": None}]
    assert len(step_events(run, "step_completed")) >= 1
    assert len(step_events(run, "step_completed")) < 3


def test_a_run_walked_slice_by_slice_starts_each_step_once(settings):
    settings.PAL_SLICE_SECONDS = 1e-9
    run = make_run(steps=[tool_step("a", "test_count"), tool_step("b", "test_count"), tool_step("c", "test_count")])
    drives = drive_to_end(run)
    assert drives > 1
    assert run.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(run)] == ["a", "b", "c"]
    assert [e.step_id for e in step_events(run, "step_started")] == ["a", "b", "c"]


# --- fencing --------------------------------------------------------------------------------------


def test_a_walk_whose_lease_was_stolen_between_steps_writes_nothing_more():
    run = make_run(steps=[tool_step("a", "test_steal_once"), tool_step("b", "test_count")])

    assert drive(run) == "fenced"

    assert kinds(run) == ["run_created", "run_started", "step_started"]
    assert calls(run, "b") == []
    assert RunLock.objects.get(run_id=run.id).owner == "task:thief"


def test_the_thief_finishes_the_run_reexecuting_the_interrupted_step_with_the_same_key():
    run = make_run(steps=[tool_step("a", "test_steal_once"), tool_step("b", "test_count")])
    drive(run)
    assert drive(run) == "walked"  # the booking now belongs to task "thief"
    assert run.status == RunStatus.SUCCEEDED
    assert [c["key"] for c in calls(run, "a")] == [f"{run.id}:a:1", f"{run.id}:a:1"]


def test_a_task_whose_booking_another_holds_does_not_walk():
    run = make_run(steps=[tool_step("a", "test_count")])
    leases.lease_reserve(run_id=run.id, task_id="other", force=True)
    assert run_drive(run_id=run.id, task_id="stale-task") == "busy"
    assert calls(run) == []
    assert kinds(run) == ["run_created"]


def test_a_duplicate_task_for_a_finished_run_writes_nothing():
    run = make_run(steps=[echo_step("a")])
    task_id = booked_task_id(run)
    drive(run)
    before = kinds(run)
    assert run_drive(run_id=run.id, task_id=task_id) == "walked"
    assert kinds(run) == before
    assert not RunLock.objects.filter(run_id=run.id).exists()


# --- side effects across a crash ------------------------------------------------------------------


def test_an_email_claimed_before_a_crash_is_not_sent_again_and_is_marked_unconfirmed(settings, mailoutbox):
    run = make_run(steps=[email_step("mail", body="hello"), echo_step("after")], input={"id": 7})
    settings.MAILERS = mailer(CRASHING_MAIL)
    with pytest.raises(BaseException, match="died while sending mail"):
        drive(run)
    settings.MAILERS = mailer(LOCMEM_MAIL)
    sweep_after_expiry(run)

    drive(run)

    assert mailoutbox == []
    effect = SideEffect.objects.get(key=f"{run.id}:mail:1")
    assert effect.status == SideEffectStatus.UNCONFIRMED
    assert step_events(run, "step_completed", "mail")[0].payload["output"]["status"] == "unconfirmed"
    assert [e.kind for e in events(run) if e.step_id == "mail"] == [
        "step_started",
        "side_effect_claimed",
        "step_started",
        "side_effect_unconfirmed",
        "step_completed",
    ]
    assert run.status == RunStatus.SUCCEEDED


# --- cancel ---------------------------------------------------------------------------------------


def test_cancel_drops_the_lease_and_journals_who_and_why():
    run = make_run(steps=[echo_step("a")])
    cancelled = run_cancel(run_id=run.id, by="alice", reason="wrong customer")
    assert cancelled.status == RunStatus.CANCELLED and cancelled.finished_at is not None
    assert not RunLock.objects.filter(run_id=run.id).exists()
    last = events(run)[-1]
    assert (last.kind, last.payload, last.writer) == (
        "run_cancelled",
        {"by": "alice", "reason": "wrong customer", "who": "alice", "why": "wrong customer"},
        "alice",
    )


def test_the_task_of_a_cancelled_run_walks_no_step():
    run = make_run(steps=[tool_step("a", "test_count")])
    task_id = booked_task_id(run)
    run_cancel(run_id=run.id, by="alice", reason="wrong customer")
    run_drive(run_id=run.id, task_id=task_id)
    assert calls(run) == []
    assert kinds(run) == ["run_created", "run_cancelled"]
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_a_walk_cancelled_during_a_step_writes_nothing_more():
    run = make_run(steps=[tool_step("a", "test_cancel"), tool_step("b", "test_count")])
    assert drive(run) == "fenced"
    assert run.status == RunStatus.CANCELLED
    assert kinds(run) == ["run_created", "run_started", "step_started", "run_cancelled"]
    assert calls(run, "b") == []


def test_cancelling_a_run_that_has_ended_is_a_conflict():
    run = make_run(steps=[echo_step("a")])
    drive(run)
    with pytest.raises(Conflict, match="already ended"):
        run_cancel(run_id=run.id, by="alice", reason="too late")
    assert kinds(run)[-1] == "run_succeeded"

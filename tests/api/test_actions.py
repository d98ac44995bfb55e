"""Custom events, re-drive, cancel, retry, approvals and signals through the API."""

import uuid

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunLock, Signal
from tests.helpers import calls, drive, drive_to_end, echo_step, expire_lease, make_run, tool_step

from .conftest import assert_error


def last_event(run):
    return JournalEvent.objects.filter(run_id=run.id).order_by("-seq").first()


# --- custom events ------------------------------------------------------------------------------------


def test_a_custom_event_is_appended_to_the_journal(operator, viewer):
    run = make_run()
    response = operator.post(
        f"/runs/{run.id}/events", {"kind": "confidence_evaluated", "step_id": "only", "payload": {"score": 0.93}}
    )
    assert response.status_code == 201
    body = response.json()
    assert (body["kind"], body["step_id"], body["payload"]) == ("confidence_evaluated", "only", {"score": 0.93})
    event = last_event(run)
    assert (event.seq, event.kind, event.writer) == (body["seq"], "confidence_evaluated", "otto")
    items = viewer.get(f"/runs/{run.id}/events", {"after_seq": body["seq"] - 1}).json()["items"]
    assert [i["kind"] for i in items] == ["confidence_evaluated"]


@pytest.mark.parametrize("kind", ["run_succeeded", "step_completed", "run_redriven", "side_effect_claimed"])
def test_a_reserved_kind_is_422(operator, kind):
    run = make_run()
    before = JournalEvent.objects.filter(run_id=run.id).count()
    assert_error(operator.post(f"/runs/{run.id}/events", {"kind": kind, "payload": {}}), 422, "reserved_kind")
    assert JournalEvent.objects.filter(run_id=run.id).count() == before


@pytest.mark.parametrize(
    "body",
    [
        {"payload": {}},
        {"kind": ""},
        {"kind": "has space"},
        {"kind": "x" * 65},
        {"kind": "ok", "step_id": "Bad Id"},
        {"kind": "ok", "extra": 1},
    ],
)
def test_a_bad_event_is_422(operator, body):
    run = make_run()
    assert_error(operator.post(f"/runs/{run.id}/events", body), 422, "validation_error")


def test_an_event_for_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/events", {"kind": "note"}), 404, "run_not_found")


def test_events_page_with_after_seq_and_limit(viewer, operator):
    run = make_run()
    for n in range(5):
        operator.post(f"/runs/{run.id}/events", {"kind": "note", "payload": {"n": n}})
    page = viewer.get(f"/runs/{run.id}/events", {"after_seq": 1, "limit": 2}).json()
    assert [i["seq"] for i in page["items"]] == [2, 3]
    assert page["next_after_seq"] == 3
    rest = viewer.get(f"/runs/{run.id}/events", {"after_seq": page["next_after_seq"]}).json()
    assert [i["seq"] for i in rest["items"]] == [4, 5, 6]
    empty = viewer.get(f"/runs/{run.id}/events", {"after_seq": 6}).json()
    assert empty == {"items": [], "next_after_seq": 6}


@pytest.mark.parametrize(
    "params", [{"after_seq": -1}, {"limit": 0}, {"limit": -5}, {"limit": 1001}, {"after_seq": "x"}]
)
def test_bad_event_paging_is_422(viewer, params):
    run = make_run()
    assert_error(viewer.get(f"/runs/{run.id}/events", params), 422, "validation_error")


def test_events_of_an_unknown_run_are_404(viewer):
    assert_error(viewer.get(f"/runs/{uuid.uuid4()}/events"), 404, "run_not_found")


# --- re-drive -----------------------------------------------------------------------------------------


def test_a_redrive_is_refused_while_a_live_lease_holds_the_run(operator):
    run = make_run()
    body = assert_error(operator.post(f"/runs/{run.id}/redrive", {"reason": "stuck?"}), 409, "lease_held")
    assert "force" in body["detail"]


def test_a_forced_redrive_steals_the_lease_with_a_new_epoch(operator):
    run = make_run()
    epoch = RunLock.objects.get(run_id=run.id).epoch
    response = operator.post(f"/runs/{run.id}/redrive", {"reason": "worker wedged", "force": True})
    assert response.status_code == 202
    assert response.json()["lease"]["epoch"] == epoch + 1
    event = last_event(run)
    assert event.kind == "run_redriven"
    assert (event.payload["by"], event.payload["why"], event.payload["force"]) == ("otto", "worker wedged", True)
    assert drive_to_end(run) and run.status == "succeeded"


def test_a_redrive_of_an_expired_lease_needs_no_force(operator):
    run = make_run()
    expire_lease(run)
    assert operator.post(f"/runs/{run.id}/redrive", {"reason": "sweep is slow"}).status_code == 202


def test_a_redrive_of_an_ended_run_is_409(operator):
    run = make_run()
    drive_to_end(run)
    assert_error(operator.post(f"/runs/{run.id}/redrive", {"reason": "again", "force": True}), 409, "run_ended")


def test_a_redrive_needs_a_reason(operator):
    run = make_run()
    assert_error(operator.post(f"/runs/{run.id}/redrive", {}), 422, "validation_error")
    assert_error(operator.post(f"/runs/{run.id}/redrive", {"reason": ""}), 422, "validation_error")
    assert_error(operator.post(f"/runs/{run.id}/redrive", {"reason": "   ", "force": True}), 400, "reason_required")


def test_a_redrive_of_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/redrive", {"reason": "x"}), 404, "run_not_found")


# --- cancel -------------------------------------------------------------------------------------------


def test_cancel_answers_202_and_journals_who_and_why(operator):
    run = make_run()
    response = operator.post(f"/runs/{run.id}/cancel", {"reason": "wrong input"})
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled" and response.json()["lease"] is None
    event = last_event(run)
    assert (event.kind, event.payload) == (
        "run_cancelled",
        {"by": "otto", "reason": "wrong input", "who": "otto", "why": "wrong input"},
    )


def test_cancelling_an_ended_run_is_409(operator):
    run = make_run()
    operator.post(f"/runs/{run.id}/cancel", {"reason": "once"})
    assert_error(operator.post(f"/runs/{run.id}/cancel", {"reason": "twice"}), 409, "run_ended")


def test_cancelling_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/cancel", {"reason": "x"}), 404, "run_not_found")


# --- retry --------------------------------------------------------------------------------------------


def test_a_failed_run_goes_on_from_its_failed_step_with_the_next_attempt(operator):
    run = make_run(steps=[tool_step("first", "test_count"), tool_step("flaky", "test_fail_before", {"succeed_on": 2})])
    drive_to_end(run)
    assert run.status == "failed"
    response = operator.post(f"/runs/{run.id}/retry", {"reason": "the API is back"})
    assert response.status_code == 202
    assert response.json()["status"] == "running" and response.json()["error"] is None
    event = last_event(run)
    assert (event.kind, event.step_id, event.attempt) == ("run_retried", "flaky", 2)
    assert (event.payload["by"], event.payload["why"], event.payload["failed_attempt"]) == (
        "otto",
        "the API is back",
        1,
    )
    drive_to_end(run)
    assert run.status == "succeeded"
    assert [c["attempt"] for c in calls(run, "flaky")] == [1, 2]
    assert [c["key"] for c in calls(run, "flaky")] == [f"{run.id}:flaky:1", f"{run.id}:flaky:2"]
    assert len(calls(run, "first")) == 1  # reused, not run again


def test_a_retry_that_fails_again_can_be_retried_again(operator):
    run = make_run(steps=[tool_step("flaky", "test_fail_before", {"succeed_on": 3})])
    drive_to_end(run)
    operator.post(f"/runs/{run.id}/retry", {"reason": "one"})
    drive_to_end(run)
    assert run.status == "failed" and run.error["attempt"] == 2
    operator.post(f"/runs/{run.id}/retry", {"reason": "two"})
    drive_to_end(run)
    assert run.status == "succeeded"


@pytest.mark.parametrize("ended", [False, True])
def test_only_a_failed_run_can_be_retried(operator, ended):
    run = make_run()
    if ended:
        drive_to_end(run)
    assert_error(operator.post(f"/runs/{run.id}/retry", {"reason": "why not"}), 409, "run_not_failed")


def test_retrying_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/retry", {"reason": "x"}), 404, "run_not_found")


# --- approvals and signals ----------------------------------------------------------------------------


def waiting_on_approval():
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "Send it?"}, echo_step("after")])
    drive(run)
    assert run.status == "waiting"
    return run


def test_an_approval_wakes_the_run(operator):
    run = waiting_on_approval()
    response = operator.post(f"/runs/{run.id}/approvals/review", {"approved": True, "comment": "fine"})
    assert response.status_code == 200
    assert response.json()["status"] == "running"
    decided = JournalEvent.objects.get(run_id=run.id, kind="approval_decided")
    assert decided.payload == {"approved": True, "by": "otto", "comment": "fine", "attempt": 1}
    drive_to_end(run)
    assert run.status == "succeeded"


def test_a_rejection_fails_the_run(operator):
    run = waiting_on_approval()
    operator.post(f"/runs/{run.id}/approvals/review", {"approved": False, "comment": "no"})
    drive_to_end(run)
    assert run.status == "failed" and run.error["code"] == "approval_rejected"


def test_an_approval_the_run_does_not_wait_on_is_409(operator):
    run = waiting_on_approval()
    assert_error(operator.post(f"/runs/{run.id}/approvals/other", {"approved": True}), 409, "not_waiting_on_approval")
    operator.post(f"/runs/{run.id}/approvals/review", {"approved": True})
    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"approved": True}), 409, "not_waiting_on_approval")


def test_an_approval_needs_a_decision(operator):
    run = waiting_on_approval()
    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"comment": "?"}), 422, "validation_error")
    assert_error(operator.post(f"/runs/{run.id}/approvals/review", {"approved": "perhaps"}), 422)


def test_a_signal_is_kept_and_taken_by_the_waiting_step(operator):
    run = make_run(steps=[{"id": "ci", "kind": "signal", "name": "ci-done"}])
    response = operator.post(f"/runs/{run.id}/signals/ci-done", {"payload": {"green": True}})
    assert response.status_code == 202
    body = response.json()
    assert (body["name"], body["payload"], body["consumed_at"]) == ("ci-done", {"green": True}, None)
    assert Signal.objects.get().sent_by == "otto"
    drive_to_end(run)
    assert run.status == "succeeded" and run.output == {"green": True}
    assert Signal.objects.get().consumed_at is not None


def test_a_signal_wakes_a_run_that_waits_on_it(operator):
    run = make_run(steps=[{"id": "ci", "kind": "signal", "name": "ci-done"}])
    drive(run)
    assert run.status == "waiting"
    operator.post(f"/runs/{run.id}/signals/ci-done", {"payload": {"n": 1}})
    run.refresh_from_db()
    assert run.status == "running"
    drive_to_end(run)
    assert run.output == {"n": 1}


def test_a_signal_to_an_ended_run_is_409(operator):
    run = make_run()
    drive_to_end(run)
    assert_error(operator.post(f"/runs/{run.id}/signals/late", {"payload": 1}), 409, "run_ended")


def test_a_signal_name_must_be_a_name(operator):
    run = make_run()
    assert_error(operator.post(f"/runs/{run.id}/signals/Not%20OK", {"payload": 1}), 422, "invalid_signal_name")


def test_a_signal_to_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/signals/x", {}), 404, "run_not_found")
    assert Run.objects.count() == 0

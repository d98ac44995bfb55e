"""Moving a run to another version of its workflow (issue 27, section 2): the preview says per step what carries over,
what runs again (and why), what is new and which keys will be claimed; the move is journaled definition_moved with
who and why, a carried-over step is never run again, one whose input changed runs again under a new attempt; runs
that a worker walks, that ended, or of a Python workflow are refused. Runs are driven inline (tests.helpers.drive)."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import leases
from runs.audit import Audit
from runs.models import Run, RunLock, RunStatus, Workflow
from runs.selectors import definition_divergence
from runs.services import (
    Conflict,
    NotFound,
    ServiceError,
    approval_decide,
    run_move,
    run_move_preview,
    run_retry,
    workflow_create,
)
from tests.helpers import (
    booked_task_id,
    calls,
    drive,
    drive_to_end,
    echo_step,
    events,
    make_run,
    record_drive_sends,
    step_events,
    tool_step,
)

pytestmark = pytest.mark.django_db

WHO = Audit(by="olga", why="v2 adds the follow-up")
REVIEW = {"id": "review", "kind": "approval", "prompt": "Send {{ input.to }} the reply?"}


@pytest.fixture(autouse=True)
def quiet_heartbeat(monkeypatch):
    """The heartbeat's own connection cannot see this test's uncommitted lease rows: it reports them held."""
    monkeypatch.setattr(leases, "lease_heartbeat", lambda owner=None: [str(r) for r in list(leases.heartbeat._held)])


def versions(name: str, *step_lists: list[dict]) -> list[Workflow]:
    return [workflow_create(definition={"name": name, "steps": steps}) for steps in step_lists]


def parked(name: str, first: list[dict], second: list[dict], input: dict | None = None) -> tuple[Run, Workflow]:
    """A run of version 1 parked on its approval, and version 2 beside it."""
    v1, v2 = versions(name, first, second)
    run = make_run(workflow=v1, input=input or {"to": "ada"})
    drive(run)
    assert run.status == RunStatus.WAITING, run.status
    return run, v2


def test_a_preview_carries_completed_and_waiting_steps_and_lists_the_new_one():
    count = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    run, v2 = parked("reply", [count, REVIEW], [count, REVIEW, tool_step("follow", "test_count", {"n": 1})])

    preview = run_move_preview(run_id=run.id, version=v2.version)

    assert [(s["step_id"], s["phase"], s["attempt"]) for s in preview["reused"]] == [
        ("draft", "completed", 1),
        ("review", "waiting", 1),
    ]
    assert preview["rerun"] == [] and preview["removed"] == [] and preview["diverging"] == []
    assert [(s["step_id"], s["attempt"]) for s in preview["new"]] == [("follow", 1)]
    assert (preview["from_version"], preview["to_version"], preview["applied"]) == (1, 2, False)
    assert preview["wakes"] is False  # the new step comes after the approval: the run keeps waiting on it
    assert run.workflow.version == 1 and not step_events(run, "definition_moved")  # a preview writes nothing


def test_a_moved_run_walks_the_new_version_and_never_repeats_a_carried_step():
    count = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    run, v2 = parked("reply2", [count, REVIEW], [count, REVIEW, tool_step("follow", "test_count", {"n": 1})])

    applied = run_move(run_id=run.id, version=v2.version, audit=WHO)

    run.refresh_from_db()
    assert applied["applied"] is True and run.workflow_id == v2.id
    (moved,) = [e for e in step_events(run, "definition_moved") if e.step_id is None]
    assert moved.payload == {
        "by": "olga",
        "who": "olga",
        "why": "v2 adds the follow-up",
        "from": 1,
        "to": 2,
        "carried": ["draft", "review"],
        "rerun": [],
        "new": ["follow"],
        "removed": [],
    }
    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "review"  # it waits where it waited
    assert not RunLock.objects.filter(run_id=run.id).exists()
    approval_decide(run_id=run.id, step_id="review", approved=True, by="ada")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(run)] == ["draft", "follow"]  # draft once, before the move
    assert len(step_events(run, "approval_requested", "review")) == 1


def test_a_waiting_run_given_a_step_it_can_run_now_goes_on_at_once_and_parks_again():
    count = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    now = {**tool_step("audit", "test_count", {"n": 1}), "needs": []}
    run, v2 = parked("reply8", [count, REVIEW], [count, REVIEW, now])

    assert run_move(run_id=run.id, version=v2.version, audit=WHO)["wakes"] is True
    drive(run)

    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "review"
    assert [c["step_id"] for c in calls(run)] == ["draft", "audit"]
    assert len(step_events(run, "approval_requested", "review")) == 1  # the same request: not asked again


def test_a_step_whose_input_changed_runs_again_under_a_new_attempt_and_key():
    old = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    new = tool_step("draft", "test_count", {"to": "{{ input.to }}", "tone": "warm"})
    run, v2 = parked("reply3", [old, REVIEW], [new, REVIEW])

    preview = run_move_preview(run_id=run.id, version=v2.version)
    (again,) = preview["rerun"]
    assert (again["step_id"], again["attempt"], again["had"], again["why"]) == ("draft", 2, 1, "input_changed")
    assert preview["diverging"] == [
        {
            "step_id": "draft",
            "code": "input_changed",
            "why": "its input as the new version renders it differs from the journaled one",
        }
    ]

    run_move(run_id=run.id, version=v2.version, audit=WHO)
    (row,) = [e for e in step_events(run, "definition_moved") if e.step_id == "draft"]
    assert (row.attempt, row.payload["had"], row.payload["why"]) == (2, 1, "input_changed")
    drive(run)  # woken: draft runs again, then the run parks on the approval that carried over
    assert run.status == RunStatus.WAITING
    assert [(c["step_id"], c["attempt"], c["key"]) for c in calls(run)] == [
        ("draft", 1, f"{run.id}:draft:1"),
        ("draft", 2, f"{run.id}:draft:2"),
    ]
    assert calls(run)[1]["args"] == {"to": "ada", "tone": "warm"}


def test_an_approval_whose_prompt_changed_is_asked_again_and_the_old_one_cannot_be_decided():
    run, v2 = parked("reply4", [REVIEW], [{**REVIEW, "prompt": "Really send {{ input.to }} the reply?"}])

    run_move(run_id=run.id, version=v2.version, audit=WHO)
    run.refresh_from_db()
    assert run.status in (RunStatus.RUNNING, RunStatus.QUEUED)  # its wait is dropped: woken at once
    drive(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["attempt"] == 2
    requested = step_events(run, "approval_requested", "review")
    assert [(e.attempt, e.payload["prompt"]) for e in requested] == [
        (1, "Send ada the reply?"),
        (2, "Really send ada the reply?"),
    ]
    with pytest.raises(Conflict):
        approval_decide(run_id=run.id, step_id="review", approved=True, by="ada", attempt=1)
    approval_decide(run_id=run.id, step_id="review", approved=True, by="ada")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED


def test_a_step_that_reads_one_that_runs_again_runs_again_too():
    first = tool_step("a", "test_count", {"x": "{{ input.to }}"})
    reads = tool_step("b", "test_count", {"from_a": "{{ steps.a.output.x }}"})
    run, v2 = parked("reply5", [first, reads, REVIEW], [{**first, "args": {"x": "{{ input.to }}!"}}, reads, REVIEW])

    preview = run_move_preview(run_id=run.id, version=v2.version)

    assert [(s["step_id"], s["why"]) for s in preview["rerun"]] == [("a", "input_changed"), ("b", "reads_rerun")]
    assert [d["step_id"] for d in preview["diverging"]] == ["a"]  # b follows from a: not named on its own


def test_a_removed_step_is_listed_and_diverges_but_keeps_its_outcome():
    run, v2 = parked("reply6", [echo_step("gone"), REVIEW], [REVIEW])

    preview = run_move_preview(run_id=run.id, version=v2.version)

    assert preview["removed"] == [{"step_id": "gone", "kind": "tool_call", "phase": "completed"}]
    assert preview["diverging"] == [
        {"step_id": "gone", "code": "gone", "why": "the new version has no step of that id"}
    ]
    assert preview["wakes"] is False  # nothing to do before the approval: it stays parked
    run_move(run_id=run.id, version=v2.version, audit=WHO)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.waiting_on["step_id"] == "review"
    assert not RunLock.objects.filter(run_id=run.id).exists()  # the move's booking is given back


def test_a_deliver_step_that_runs_again_names_the_key_it_will_claim():
    mail = {
        "id": "mail",
        "kind": "deliver",
        "channel": "email",
        "to": ["{{ input.to }}@example.com"],
        "subject": "Hi",
        "body": "hello",
    }
    run, v2 = parked("reply7", [REVIEW, {**mail}], [REVIEW, {**mail, "subject": "Hello"}, {**mail, "id": "more"}])

    preview = run_move_preview(run_id=run.id, version=v2.version)

    assert [(s["key"], s["why"]) for s in preview["side_effects"]] == [
        (f"{run.id}:mail:1", "pending"),
        (f"{run.id}:more:1", "new"),
    ]


def test_a_failed_run_moved_stays_failed_and_a_retry_goes_on_on_the_new_version():
    v1, v2 = versions(
        "billing",
        [echo_step("load"), tool_step("charge", "test_fail")],
        [echo_step("load"), tool_step("charge", "test_count", {"ok": True})],
    )
    run = make_run(workflow=v1)
    drive_to_end(run)
    assert run.status == RunStatus.FAILED

    preview = run_move_preview(run_id=run.id, version=v2.version)
    assert [(s["step_id"], s["why"], s["attempt"]) for s in preview["rerun"]] == [("charge", "failed", 2)]
    run_move(run_id=run.id, version=v2.version, audit=WHO)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.workflow_id == v2.id
    assert run.journal_head_seq == events(run)[-1].seq  # its recorded head moved to the move's row

    run_retry(run_id=run.id, by="olga", reason="the charge step is mended in v2")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [(c["step_id"], c["attempt"]) for c in calls(run, "charge")] == [("charge", 1), ("charge", 2)]


def test_a_queued_run_booked_for_a_task_is_moved_and_that_task_does_nothing(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = record_drive_sends(monkeypatch)
    v1, v2 = versions("queued", [echo_step("a")], [echo_step("a"), echo_step("b")])
    run = make_run(workflow=v1)
    first_task = booked_task_id(run)

    with django_capture_on_commit_callbacks(execute=True):
        run_move(run_id=run.id, version=v2.version, audit=WHO)

    assert leases.lease_acquire(run_id=run.id, task_id=first_task) is None  # the old booking's task: busy
    assert sent[-1]["run_id"] == str(run.id) and sent[-1]["task_id"] == booked_task_id(run)
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED and [e.step_id for e in step_events(run, "step_completed")] == ["a", "b"]


def test_a_run_a_worker_walks_is_refused_lease_held_and_nothing_changes():
    v1, v2 = versions("busy", [echo_step("a")], [echo_step("b")])
    run = make_run(workflow=v1)
    RunLock.objects.filter(run_id=run.id).update(owner="host:1:abcd", expires_at=timezone.now() + timedelta(minutes=1))

    with pytest.raises(Conflict) as refused:
        run_move(run_id=run.id, version=v2.version, audit=WHO)

    assert refused.value.code == "lease_held"
    run.refresh_from_db()
    assert run.workflow_id == v1.id and not step_events(run, "definition_moved")
    assert run_move_preview(run_id=run.id, version=v2.version)["held"]["owner"] == "host:1:abcd"


@pytest.mark.parametrize(
    ("version", "code", "error"),
    [(1, "same_version", Conflict), (9, "version_not_found", NotFound), (0, "invalid_version", ServiceError)],
)
def test_a_move_to_its_own_or_a_missing_version_is_refused(version, code, error):
    run, _ = parked("refusals", [REVIEW], [REVIEW])
    with pytest.raises(error) as refused:
        run_move(run_id=run.id, version=version, audit=WHO)
    assert refused.value.code == code


def test_a_run_that_ended_is_refused_run_ended():
    v1, v2 = versions("ended", [echo_step("a")], [echo_step("a")])
    run = make_run(workflow=v1)
    drive_to_end(run)
    for move in (run_move_preview, lambda **kw: run_move(**kw, audit=WHO)):
        with pytest.raises(Conflict) as refused:
            move(run_id=run.id, version=v2.version)
        assert refused.value.code == "run_ended"


def test_a_python_workflows_run_is_refused_not_a_json_workflow():
    definition = {"code": "tests.code.sample_workflows:py_sum", "steps": []}
    v1 = Workflow.objects.create(name="py-moved", version=1, definition=definition)
    Workflow.objects.create(name="py-moved", version=2, definition={**definition, "code_version": "b"})
    run = Run.objects.create(workflow=v1, status=RunStatus.WAITING)
    with pytest.raises(ServiceError) as refused:
        run_move(run_id=run.id, version=2, audit=WHO)
    assert (refused.value.code, refused.value.status) == ("not_a_json_workflow", 422)


def test_an_unknown_run_is_404():
    with pytest.raises(NotFound):
        run_move_preview(run_id=uuid.uuid4(), version=2)


def test_a_check_names_each_live_run_and_step_that_would_diverge_and_leaves_ended_ones_out():
    old = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
    v1, _ = versions("checked", [old, REVIEW], [old, REVIEW])
    waiting = make_run(workflow=v1, input={"to": "ada"})
    drive(waiting)
    ended = make_run(workflow=v1, input={"to": "bob"})
    drive(ended)
    approval_decide(run_id=ended.id, step_id="review", approved=True, by="bob")
    drive_to_end(ended)
    changed = {"name": "checked", "steps": [{**old, "args": {"to": "{{ input.to }}", "cc": "x"}}, REVIEW]}

    live = definition_divergence(definition=changed)
    every = definition_divergence(definition=changed, ended=True)
    same = definition_divergence(definition={"name": "checked", "steps": [old, REVIEW]})

    assert live["checked"] == 1 and [(d["run_id"], d["step_id"]) for d in live["diverging"]] == [
        (str(waiting.id), "draft")
    ]
    assert every["checked"] == 2 and {d["run_id"] for d in every["diverging"]} == {str(waiting.id), str(ended.id)}
    assert same == {"checked": 1, "diverging": []}

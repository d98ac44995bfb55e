"""POST /runs/{id}/move (CONTRACT section 12): a dry run answers the preview {reused, rerun, new, side_effects}
and changes nothing; without it the move is made, journaled definition_moved, and answered with the run. Refusals
answer {detail, code}: 404, 409, 422, and 403 before the body for a viewer. POST /workflows?dry_run=true answers
{diverging: [{run_id, step_id, why}], checked} and stores nothing."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, RunLock, RunStatus, Workflow
from tests.api.conftest import assert_error
from tests.helpers import drive, drive_to_end, echo_step, events, make_run, tool_step

pytestmark = pytest.mark.django_db

REVIEW = {"id": "review", "kind": "approval", "prompt": "Ship {{ input.to }}?"}
DRAFT = tool_step("draft", "test_count", {"to": "{{ input.to }}"})


def post_versions(operator, name: str, *step_lists: list[dict]) -> None:
    for steps in step_lists:
        assert operator.post("/workflows", {"name": name, "steps": steps}).status_code == 201


@pytest.fixture
def parked(operator) -> Run:
    """A run of `reply` v1 parked on its approval; v2 adds a step after it."""
    post_versions(operator, "reply", [DRAFT, REVIEW], [DRAFT, REVIEW, echo_step("follow")])
    run = make_run(workflow=Workflow.objects.get(name="reply", version=1), input={"to": "ada"})
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def test_a_dry_run_answers_the_preview_and_changes_nothing(operator, parked):
    answer = operator.post(f"/runs/{parked.id}/move", {"version": 2, "dry_run": True})

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert [s["step_id"] for s in body["reused"]] == ["draft", "review"]
    assert body["rerun"] == [] and [s["step_id"] for s in body["new"]] == ["follow"] and body["side_effects"] == []
    assert (body["from_version"], body["to_version"], body["applied"], body["run"]) == (1, 2, False, None)
    parked.refresh_from_db()
    assert parked.workflow.version == 1 and not events(parked, "definition_moved")


def test_a_move_answers_the_applied_preview_and_the_run_on_its_new_version(operator, parked):
    answer = operator.post(f"/runs/{parked.id}/move", {"version": 2, "reason": "v2 follows up"})

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["applied"] is True and body["run"]["version"] == 2 and body["run"]["id"] == str(parked.id)
    (moved,) = [e for e in events(parked, "definition_moved") if e.step_id is None]
    assert (moved.payload["by"], moved.payload["why"], moved.payload["new"]) == ("otto", "v2 follows up", ["follow"])
    assert operator.get(f"/runs/{parked.id}").json()["version"] == 2


def test_a_move_without_a_reason_is_refused_and_changes_nothing(operator, parked):
    assert_error(operator.post(f"/runs/{parked.id}/move", {"version": 2}), 400, "reason_required")
    assert_error(operator.post(f"/runs/{parked.id}/move", {"version": 2, "reason": "  "}), 400, "reason_required")
    assert not events(parked, "definition_moved")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"version": 9, "reason": "r"}, 404, "version_not_found"),
        ({"version": 1, "reason": "r"}, 409, "same_version"),
        ({"version": 0, "reason": "r"}, 422, "validation_error"),
        ({"version": "two", "reason": "r"}, 422, "validation_error"),
        ({"reason": "r"}, 422, "validation_error"),
        ({"version": 2, "reason": "r", "force": True}, 422, "validation_error"),
    ],
)
def test_a_bad_move_is_refused_with_its_code(operator, parked, body, status, code):
    assert_error(operator.post(f"/runs/{parked.id}/move", body), status, code)
    assert not events(parked, "definition_moved")


def test_an_unknown_run_is_404(operator):
    assert_error(operator.post(f"/runs/{uuid.uuid4()}/move", {"version": 2, "reason": "r"}), 404, "run_not_found")


def test_an_ended_run_is_409_run_ended(operator):
    post_versions(operator, "done", [echo_step("a")], [echo_step("a")])
    run = make_run(workflow=Workflow.objects.get(name="done", version=1))
    drive_to_end(run)
    assert_error(operator.post(f"/runs/{run.id}/move", {"version": 2, "reason": "r"}), 409, "run_ended")
    assert_error(operator.post(f"/runs/{run.id}/move", {"version": 2, "dry_run": True}), 409, "run_ended")


def test_a_run_a_worker_walks_is_409_lease_held(operator):
    post_versions(operator, "busy", [echo_step("a")], [echo_step("b")])
    run = make_run(workflow=Workflow.objects.get(name="busy", version=1))
    RunLock.objects.filter(run_id=run.id).update(owner="host:7:beef", expires_at=timezone.now() + timedelta(minutes=1))
    assert_error(operator.post(f"/runs/{run.id}/move", {"version": 2, "reason": "r"}), 409, "lease_held")
    assert operator.post(f"/runs/{run.id}/move", {"version": 2, "dry_run": True}).json()["held"]["owner"] == (
        "host:7:beef"
    )


def test_a_python_workflows_run_is_422_not_a_json_workflow(operator):
    definition = {"code": "tests.code.sample_workflows:py_sum", "steps": []}
    v1 = Workflow.objects.create(name="py-api-moved", version=1, definition=definition)
    Workflow.objects.create(name="py-api-moved", version=2, definition=definition)
    run = Run.objects.create(workflow=v1, status=RunStatus.QUEUED)
    answer = operator.post(f"/runs/{run.id}/move", {"version": 2, "reason": "r"})
    assert_error(answer, 422, "not_a_json_workflow")


def test_a_viewer_is_refused_before_the_body(viewer, parked):
    assert_error(viewer.post(f"/runs/{parked.id}/move", {"version": 2, "reason": "r"}), 403, "forbidden")
    assert not events(parked, "definition_moved")


# --- POST /workflows?dry_run=true -------------------------------------------------------------------


def test_a_dry_run_post_names_the_runs_and_steps_that_would_diverge_and_stores_nothing(operator, parked):
    changed = {"name": "reply", "steps": [{**DRAFT, "args": {"to": "{{ input.to }}", "cc": "ops"}}, REVIEW]}

    answer = operator.post("/workflows?dry_run=true", changed)

    assert answer.status_code == 200, answer.content
    (diverging,) = answer.json()["diverging"]
    assert (diverging["run_id"], diverging["step_id"], diverging["code"]) == (str(parked.id), "draft", "input_changed")
    assert diverging["why"] and answer.json()["checked"] == 1
    assert Workflow.objects.filter(name="reply").count() == 2  # nothing stored


def test_a_dry_run_post_of_a_definition_that_keeps_the_runs_answers_none(operator, parked):
    same = {"name": "reply", "steps": [DRAFT, REVIEW, echo_step("later")]}
    answer = operator.post("/workflows?dry_run=true", same)
    assert answer.status_code == 200 and answer.json() == {"checked": 1, "diverging": []}


def test_a_dry_run_post_of_an_invalid_definition_is_still_422(operator):
    answer = operator.post("/workflows?dry_run=true", {"name": "reply", "steps": [{"id": "a", "kind": "nope"}]})
    body = assert_error(answer, 422, "invalid_workflow")
    assert body["errors"]


def test_a_dry_run_post_with_runs_out_of_range_is_422(operator):
    answer = operator.post("/workflows?dry_run=true&runs=0", {"name": "reply", "steps": [echo_step("a")]})
    assert_error(answer, 422, "validation_error")

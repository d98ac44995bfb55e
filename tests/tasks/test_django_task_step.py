"""The django_task step kind in a JSON workflow: a task run as a step, its output journaled; what it refuses."""

import pytest

from runs.models import RunStatus
from runs.services import workflow_create
from runs.workflows import WorkflowInvalid
from tests.helpers import drive_to_end, make_run, step_events

pytestmark = pytest.mark.django_db


def task_step(path, args):
    return {"id": "t", "kind": "django_task", "task": path, "args": args}


def test_a_task_is_a_step_whose_output_is_its_return_value():
    run = make_run(steps=[task_step("tests.tasks.sample_tasks.add", {"args": [2], "kwargs": {"b": 40}})])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED and run.output == 42
    (called,) = step_events(run, "task_called")
    assert called.payload == {"task": "tests.tasks.sample_tasks.add"}


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("tests.tasks.sample_tasks.nothing", "unknown_task", "no task"),
        ("tests.tasks.sample_tasks.Path", "unknown_task", "is not a task"),
        ("tests.tasks.sample_tasks.refuse", "task_error", "ValueError: refused: x"),
    ],
)
def test_a_task_that_cannot_run_fails_the_step_with_a_code(path, code, words):
    run = make_run(steps=[task_step(path, {"kwargs": {"reason": "x"}})])
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    (failed,) = step_events(run, "step_failed")
    assert failed.payload["code"] == code and words in failed.payload["message"], failed.payload


def test_a_definition_without_a_dotted_task_is_refused_naming_the_field():
    with pytest.raises(WorkflowInvalid) as caught:
        workflow_create(definition={"name": "bad-task", "steps": [{"id": "t", "kind": "django_task", "task": "x"}]})
    assert any(error["loc"].endswith("task") for error in caught.value.errors), caught.value.errors

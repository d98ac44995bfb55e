"""timeout_seconds: a step that runs past it fails with step_timeout (tools stop at their next check)."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive_to_end, make_run, step_events

pytestmark = pytest.mark.django_db


def test_a_sleep_tool_past_its_timeout_fails_the_step_with_step_timeout():
    run = make_run(
        steps=[{"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 5}, "timeout_seconds": 0.5}]
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "step_timeout"
    assert "0.5s" in run.error["message"]
    assert step_events(run, "step_completed") == []


def test_a_step_inside_its_timeout_completes():
    run = make_run(
        steps=[{"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 0.2}, "timeout_seconds": 5}]
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == {"slept": 0.2}

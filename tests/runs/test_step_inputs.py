"""step_started.payload.input (issue 13): every kind's input as its code got it, secret-named keys redacted and
every configured secret value masked, journaled once per attempt (not again when the same attempt runs again)."""

import json

import pytest

from runs.models import RunStatus
from runs.secrets import REDACTED
from runs.services import workflow_create
from tests.helpers import Crash, drive, drive_to_end, events, make_run, step_events, sweep_after_expiry, tool_step

pytestmark = pytest.mark.django_db

SECRET = "sk-live-0123456789abcdef"


@pytest.fixture(autouse=True)
def _a_configured_secret(settings):
    settings.PAL_LLM_API_KEY = SECRET


def inputs(run) -> dict[str, dict]:
    return {e.step_id: e.payload.get("input") for e in step_events(run, "step_started") if "input" in e.payload}


def test_each_kind_journals_what_it_was_given_rendered_from_its_templates():
    workflow_create(definition={"name": "kid", "steps": [tool_step("k", "echo", {"x": "{{ input.x }}"})]})
    run = make_run(
        steps=[
            tool_step("tool", "echo", {"q": "{{ input.q }}", "n": 2}),
            {
                "id": "llm",
                "kind": "llm_call",
                "provider": "fake",
                "model": "gpt-4o-mini",
                "prompt": "Say {{ input.q }}",
            },
            {"id": "kid", "kind": "child_run", "workflow": "kid", "input": {"x": "{{ steps.tool.output.q }}"}},
            {"id": "nap", "kind": "sleep", "seconds": 0},
            {
                "id": "fan",
                "kind": "tool_call",
                "tool": "echo",
                "args": {"i": "{{ item }}"},
                "for_each": "{{ input.xs }}",
            },
        ],
        input={"q": "hello", "xs": ["a", "b"]},
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    got = inputs(run)
    assert got["tool"] == {"tool": "echo", "args": {"q": "hello", "n": 2}}
    assert got["llm"]["prompt"] == "Say hello" and got["llm"]["model"] == "gpt-4o-mini"
    assert got["kid"] == {"workflow": "kid", "input": {"x": "hello"}}
    assert got["nap"] == {"seconds": 0}
    assert (got["fan[0]"], got["fan[1]"]) == (
        {"tool": "echo", "args": {"i": "a"}},
        {"tool": "echo", "args": {"i": "b"}},
    )


def test_secret_named_keys_are_redacted_and_secret_values_masked_everywhere_in_the_journal():
    run = make_run(
        steps=[
            tool_step(
                "call",
                "echo",
                {
                    "api_key": "abc",
                    "headers": {"Authorization": "Bearer xyz", "X-Trace": "t1"},
                    "db_password": "hunter2",
                    "note": f"the key is {SECRET}",
                },
            )
        ]
    )

    drive_to_end(run)

    sent = inputs(run)["call"]["args"]
    assert sent["api_key"] == REDACTED and sent["db_password"] == REDACTED
    assert sent["headers"] == {"Authorization": REDACTED, "X-Trace": "t1"}
    assert SECRET not in sent["note"]
    started = json.dumps([e.payload for e in step_events(run, "step_started")])
    assert SECRET not in started and "hunter2" not in started and "Bearer xyz" not in started


def test_an_attempt_that_runs_again_after_a_crash_journals_its_input_once():
    big = "x" * 1_000_000
    run = make_run(steps=[tool_step("once", "test_crash_once", {"prompt": big})])
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)

    drive_to_end(run)

    first, again = step_events(run, "step_started")
    assert first.payload["input"]["args"]["prompt"] == big
    assert again.payload.get("resumed") is True and "input" not in again.payload
    holding = [e.kind for e in events(run) if big in json.dumps(e.payload)]
    assert holding == ["step_started", "step_completed", "run_succeeded"]  # the input once; the output as ever

"""Runs that never ended and repeated their last step (issue 23, section 1), on real workers, Postgres and Redis:
each is now a definite failure with a code, its last step is not sent again by a re-drive, and its concurrency
slot goes on to the next run of its group."""

import json
import sys
import time
import uuid

import pytest

from runs.models import Run, RunStatus
from runs.recovery import sweep_once
from runs.services import run_create, workflow_create
from tests.durability import walk_faults  # noqa: F401  (its tool, for this process to validate the workflow)
from tests.helpers import QUICK, calls_with_key, describe, echo, events, key, llm, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WITH_FAULTS = {"extra_args": (*QUICK["extra_args"], "--include", "tests.durability.walk_faults")}


def two_runs_of_one_slot(*steps: dict, output: str | None = None, input: dict | None = None) -> tuple[Run, Run]:
    """A workflow whose group runs one at a time, and two runs of it: the second waits for the first's slot."""
    name = f"walk-{uuid.uuid4().hex[:10]}"
    extra = {"output": output} if output else {}
    workflow_create(definition={"name": name, "concurrency": {"max_runs": 1}, "steps": list(steps), **extra})
    first, _ = run_create(workflow_name=name, input=input or {})
    second, _ = run_create(workflow_name=name, input={})
    return first, second


def sweep_a_few_times(seconds: float = 6.0) -> None:
    """Play the beat past lease expiry (TTL 2 s) a few times: a run left running would be re-driven."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sweep_once(who="test-beat")
        time.sleep(0.5)


def assert_failed_with(run: Run, code: str, step_id: str | None) -> None:
    assert run.status == RunStatus.FAILED, describe(run)
    assert run.error["code"] == code and run.error["step_id"] == step_id, describe(run)
    assert events(run, "run_failed"), describe(run)


def test_a_when_that_cannot_compare_fails_the_run_and_its_model_call_is_sent_once(celery_workers, llm_provider):
    celery_workers(llm_provider.env(), name="when", **QUICK)
    # The model's text is a string: `> 5` cannot compare it (a when_error), and the first run holds the only slot.
    first, second = two_runs_of_one_slot(llm("a", "Count"), {**echo("b"), "when": "steps.a.output.text > 5"})

    first = wait_for_end(first, timeout=30)
    second = wait_for_end(second, timeout=30)  # it got the slot
    sweep_a_few_times()

    for run in (first, second):
        run.refresh_from_db()
        assert_failed_with(run, "when_error", "b")
        assert len(calls_with_key(llm_provider, key(run, "a"))) == 1, describe(run)
        assert len(events(run, "step_completed", "a")) == 1  # the step's outcome was written
        assert not events(run, "run_redriven"), describe(run)


def test_an_output_reading_a_skipped_step_fails_the_run_with_template_error(celery_workers, llm_provider):
    celery_workers(llm_provider.env(), name="output", **QUICK)
    first, second = two_runs_of_one_slot(
        llm("a", "Say hi"),
        {**echo("b", text="never"), "when": "steps.a.output.text == 'no such answer'"},
        output="{{ steps.b.output.text }}",
    )

    first = wait_for_end(first, timeout=30)
    second = wait_for_end(second, timeout=30)
    sweep_a_few_times()

    for run in (first, second):
        run.refresh_from_db()
        assert_failed_with(run, "template_error", None)
        assert "steps.b.output.text" in run.error["message"]
        assert len(calls_with_key(llm_provider, key(run, "a"))) == 1, describe(run)
        assert events(run, "step_skipped", "b") and not events(run, "run_redriven"), describe(run)


@pytest.mark.parametrize("producer", ["tool", "agent"])
def test_a_step_whose_output_is_not_json_fails_with_internal_error(celery_workers, llm_provider, settings, producer):
    # An agent that prints NaN (json.loads takes it; jsonb refuses it) and a Python tool that returns a set.
    agents = {"nan": [sys.executable, "-c", "import sys; sys.stdin.read(); print('{\"score\": NaN}')"]}
    settings.PAL_AGENTS = agents
    celery_workers({**llm_provider.env(), "PAL_AGENTS": json.dumps(agents)}, name="notjson", **WITH_FAULTS)
    odd = (
        {"id": "odd", "kind": "tool_call", "tool": "test_worker_not_json", "args": {}}
        if producer == "tool"
        else {"id": "odd", "kind": "agent", "agent": "nan", "input": {}}
    )
    first, second = two_runs_of_one_slot(llm("a", "Go"), odd)

    first = wait_for_end(first, timeout=30)
    second = wait_for_end(second, timeout=30)
    sweep_a_few_times()

    for run in (first, second):
        run.refresh_from_db()
        assert_failed_with(run, "internal_error", "odd")
        where = "output.seen is a set" if producer == "tool" else "output.score is nan"
        assert where in run.error["message"], describe(run)
        assert len(calls_with_key(llm_provider, key(run, "a"))) == 1, describe(run)
        assert not events(run, "run_redriven"), describe(run)


def test_a_bug_in_the_walk_that_repeats_fails_the_run_after_three_walks(celery_workers, llm_provider):
    celery_workers({**llm_provider.env(), "PAL_TEST_WALK_BUG": "1"}, name="bug", **WITH_FAULTS)
    first, second = two_runs_of_one_slot(llm("a", "Think"), echo("b"), input={"walk_bug": True})

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Run.objects.get(id=first.id).status != RunStatus.FAILED:
        sweep_once(who="test-beat")  # the beat: each crash is left to it
        time.sleep(0.25)
    second = wait_for_end(second, timeout=30)
    sweep_a_few_times()

    first.refresh_from_db()
    assert_failed_with(first, "internal_error", None)
    assert first.error["message"] == "KeyError: 'a bug in the walk'", describe(first)
    assert [e.payload["crashes"] for e in events(first, "walk_crashed")] == [1, 2, 3], describe(first)
    # Each walk sent a's call again (its outcome was pending when the walk crashed), under the same key: three
    # walks, three sends, and no more once the run failed.
    assert len(calls_with_key(llm_provider, key(first, "a"))) == 3, describe(first)
    assert second.status == RunStatus.SUCCEEDED, describe(second)  # it got the slot

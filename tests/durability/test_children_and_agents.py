"""Child runs and in-VM agents across a kill -9 of real worker processes (issue 3).

Real `celery -A pal worker` processes run on the test's Postgres database and the Redis broker; the test kills
the whole worker process group with SIGKILL, starts a new worker and plays the beat scheduler itself with
sweep_once() until the run ends. Every wait is bounded and fails saying what never happened.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from runs.models import Run, RunStatus
from runs.services import run_create, workflow_create
from tests.helpers import LEASE_TTL, describe, events, sweep_until_end, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def test_sweeps_like_the_workers(settings):
    """The sweep in this process must agree with the workers (PAL_LEASE_TTL=2 in tests.conftest.worker_env)."""
    settings.PAL_LEASE_TTL = LEASE_TTL


def post(*steps: dict, name: str | None = None) -> str:
    name = name or f"durability-{uuid.uuid4().hex[:10]}"
    workflow_create(definition={"name": name, "steps": list(steps)})
    return name


def process_gone(pid: int) -> bool:
    """True when no process has this pid, or only its zombie does (it runs no code; its reaper is elsewhere)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_child_is_adopted_after_its_worker_is_killed_and_the_parent_finishes_with_its_output(celery_workers):
    child_name = post(
        {"id": "slow", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 4}},
        {"id": "answer", "kind": "tool_call", "tool": "echo", "args": {"q": "{{ input.q }}", "from": "child"}},
    )
    parent_name = post({"id": "sub", "kind": "child_run", "workflow": child_name, "input": {"q": "{{ input.q }}"}})
    first = celery_workers(name="first")
    parent, _ = run_create(workflow_name=parent_name, input={"q": "why"})

    child = wait_until(
        lambda: Run.objects.filter(parent_run_id=parent.id).first(),
        timeout=30,
        what="the child row",
        explain=lambda: describe(parent),
    )
    wait_until(
        lambda: events(child, "step_started", "slow"),
        timeout=30,
        what="the child's slow step to start",
        explain=lambda: describe(child),
    )
    first.kill()
    assert events(parent, "step_completed", "sub") == [], describe(parent)
    celery_workers(name="second")

    parent = sweep_until_end(parent, timeout=60)

    assert parent.status == RunStatus.SUCCEEDED, describe(parent)
    (only,) = Run.objects.filter(parent_run_id=parent.id)
    assert only.id == child.id
    assert Run.objects.filter(workflow__name=child_name).count() == 1
    (adopted,) = events(parent, "child_adopted", "sub")
    assert adopted.payload["child_run_id"] == str(child.id)
    assert len(events(parent, "child_created", "sub")) == 1
    child.refresh_from_db()
    assert child.status == RunStatus.SUCCEEDED, describe(child)
    assert parent.output == child.output == {"q": "why", "from": "child"}
    assert events(parent, "step_completed", "sub")[0].payload["child_run_id"] == str(child.id)
    # The child was never re-driven on its own: only its parent was.
    assert events(child, "run_redriven") == []
    assert events(parent, "run_redriven")


def test_an_agent_redriven_after_its_worker_is_killed_sees_pal_resume_with_the_same_key(celery_workers, tmp_path):
    record = tmp_path / "agent-record.jsonl"

    def seen() -> list[dict]:
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    name = post({"id": "code", "kind": "agent", "agent": "coder", "input": {"sleep": 4, "task": "patch"}})
    env = {"PAL_AGENT_RECORD": str(record), "PAL_AGENT_ENV": "PAL_AGENT_RECORD"}  # agents get only what is named
    first = celery_workers(env, name="first")
    run, _ = run_create(workflow_name=name, input={})

    (before,) = wait_until(seen, timeout=30, what="the agent's first record line", explain=lambda: describe(run))
    first.kill()
    # The agent leads a group of its own, so the kill of the worker's group does not reach it: it dies with its
    # worker (PR_SET_PDEATHSIG), long before its 4-second sleep would have ended.
    wait_until(
        lambda: process_gone(before["pid"]),
        timeout=2,
        what=f"the first agent (pid {before['pid']}) to die with its worker",
    )
    celery_workers(env, name="second")

    run = sweep_until_end(run, timeout=60)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    lines = seen()
    assert len(lines) == 2, lines
    assert lines[0]["resume"] is False
    assert lines[1]["resume"] is True
    assert lines[0]["key"] == lines[1]["key"] == f"{run.id}:code:1"
    assert lines[0]["run_id"] == lines[1]["run_id"] == str(run.id)
    assert run.output == {"result": "done: patch", "resumed": True, "key": f"{run.id}:code:1"}
    started = events(run, "step_started", "code")
    assert [(e.attempt, e.payload.get("resumed")) for e in started] == [(1, None), (1, True)]

"""An agent loop on real workers, killed -9 at every turn: each model key billed once, each tool key run once.

The model (tests.support.peers.agent_reply) asks for two tool calls a turn for five turns, then answers. The
provider holds each answer a while; the worker is SIGKILLed as soon as a model call with a new key comes in (one
kill per turn, each while that turn's call is in flight), a new worker starts and the test plays the beat."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from runs.recovery import sweep_once
from tests.code import agent_tools  # noqa: F401  (registers the tools the workflow names, in this process too)
from tests.helpers import QUICK, assert_gap_free, describe, events, start_run, wait_until
from tests.support.peers import agent_reply

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TURNS, CALLS = 5, 2  # turns with tool calls; one more turn answers


def test_an_agent_loop_killed_at_every_turn_bills_each_model_key_once_and_runs_each_tool_once(
    celery_workers, llm_provider, tmp_path
):
    calls_file = tmp_path / "tools.jsonl"
    llm_provider.reply = agent_reply(turns=TURNS + 1, calls=CALLS, tool="lookup")
    llm_provider.delay = 0.5  # each answer is held a while: the kill lands while the call is in flight
    env = {
        **llm_provider.env(),
        "PAL_WORKFLOW_MODULES": "tests.code.agent_tools",
        "PAL_TEST_CALLS_FILE": str(calls_file),
    }
    worker = celery_workers(env, name="agent-0", **QUICK)
    step = {"id": "agent", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "look", "tools": ["lookup"]}
    run = start_run(step)
    killed_at: list[str] = []  # the model key in flight at each kill

    def keys() -> list[str]:
        seen: list[str] = []
        for call in llm_provider.calls:
            if call.idempotency_key not in seen:
                seen.append(call.idempotency_key or "")
        return seen

    def new_turn_or_end() -> bool:
        run.refresh_from_db()
        sweep_once(who="test-beat")
        return run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED) or len(keys()) > len(killed_at)

    while True:
        wait_until(new_turn_or_end, timeout=90, what="the next model turn", explain=lambda: describe(run))
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            break
        killed_at.append(keys()[-1])
        worker.kill()
        worker = celery_workers(env, name=f"agent-{len(killed_at)}", **QUICK)
    wait_until(
        lambda: new_turn_or_end() and run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=120,
        what="the run to end",
        explain=lambda: describe(run),
    )

    run = Run.objects.get(id=run.id)
    resent = sum(1 for call in llm_provider.calls if call.outcome == "replayed")
    print(f"{len(killed_at)} kills, one per turn; {len(llm_provider.calls)} model requests, {resent} replayed")
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    model_keys = [f"{run.id}:agent:1:turn{t}" for t in range(1, TURNS + 2)]
    assert killed_at == model_keys, killed_at  # a kill in every turn's model call
    assert llm_provider.billed == dict.fromkeys(model_keys, 1), llm_provider.billed
    # Each tool call ran once under its own key: the kills landed in model calls, whose answers were re-asked for.
    ran = [json.loads(line)["key"] for line in calls_file.read_text().splitlines()]
    tool_keys = [f"{run.id}:agent[{t}.{n}]:1" for t in range(1, TURNS + 1) for n in range(CALLS)]
    assert ran == tool_keys, ran
    turns = run.output["turns"]
    assert [len(turn["tool_calls"]) for turn in turns] == [CALLS] * TURNS + [0]
    assert turns[4]["tool_calls"][1]["result"] == {"found": "thing 5.1"}
    # One llm_turn row per turn, however many walks the kills made.
    rows = JournalEvent.objects.filter(run_id=run.id, kind="llm_turn").order_by("seq")
    assert [row.payload["turn"] for row in rows] == list(range(1, TURNS + 2))
    assert len(events(run, "step_completed", "agent")) == 1 and len(events(run, "run_succeeded")) == 1
    assert_gap_free(run)

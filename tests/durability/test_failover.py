"""A failover: the primary Postgres dies (SIGKILL of its postmaster) in the middle of runs and its synchronous standby
is promoted. No committed row is lost, no step is done twice at a peer, and the same workers, beat and web process
finish every run, the ones in flight and the ones posted after, without a restart.

A private primary and a streaming standby (tests/support/standby.py: pg_basebackup -R, synchronous_standby_names
'*', so a commit returns once the standby has it), a private Redis, two real workers, a real beat and a real uvicorn
(tests.durability.private_stack), all on one multi-host DATABASE_URL, 127.0.0.1:P1,127.0.0.1:P2 with
target_session_attrs=read-write: a new connection skips the dead primary and the standby until it is promoted.
The model calls go to the local provider (it bills a key once) and the webhooks to the local receiver (it counts
every delivery).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.durability.private_stack import Stack
from tests.durability.test_database_away import Client, _each_step_once, _first
from tests.helpers import wait_until
from tests.support.standby import kill_postmaster, multi_host_url, promote, start_standby

pytestmark = pytest.mark.integration

RUNS_IN_FLIGHT, RUNS_AFTER = 8, 4


def _flow(hook_url: str) -> dict:
    return {
        "name": "failover",
        "steps": [
            {"id": "first", "kind": "tool_call", "tool": "echo", "args": {"n": "{{ input.n }}"}},
            {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "DRAFT n={{ input.n }};"},
            {"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 1}},
            {"id": "notify", "kind": "deliver", "channel": "webhook", "url": hook_url, "body": {"n": "{{ input.n }}"}},
            {"id": "final", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "FINAL n={{ input.n }};"},
        ],
    }


STEPS = 5


@pytest.fixture
def stack(tmp_path, llm_provider, webhook_receiver):
    stack = Stack(tmp_path, workers=2, concurrency=2, env={**llm_provider.env(), **webhook_receiver.env()})
    stack.clients, stack.standby = [], None
    primary = stack.postgres
    try:
        stack.standby = start_standby(tmp_path, primary)
        stack.database_url = stack.env["DATABASE_URL"] = multi_host_url(primary, stack.standby)
        stack.start()
        stack.shell(
            f"from runs.services import workflow_create; workflow_create(definition={_flow(webhook_receiver.url)!r})"
        )
        stack.base = stack.web()
        stack.token, stack.session = stack.operator()
        yield stack
    finally:
        for client in stack.clients:
            client.close()
        other = stack.standby if stack.postgres is primary else primary
        try:
            stack.close()  # destroys stack.postgres, the primary of the moment
        finally:
            if other is not None:
                other.destroy()


def _completed_steps(server) -> int:
    return int(server.psql("SELECT count(*) FROM journal_events WHERE kind = 'step_completed'", database="pal"))


def test_the_primary_killed_mid_run_and_its_standby_promoted_lose_nothing_and_do_nothing_twice(
    stack, llm_provider, webhook_receiver
):
    client = Client(stack)
    posted = [client.post_run("failover", n) for n in range(RUNS_IN_FLIGHT)]
    assert [p.status_code for p in posted] == [201] * RUNS_IN_FLIGHT, [p.text for p in posted]
    in_flight = [p.json()["id"] for p in posted]
    primary, standby = stack.postgres, stack.standby
    wait_until(lambda: _completed_steps(primary) >= RUNS_IN_FLIGHT, timeout=60, what="the runs under way")
    committed = set(stack.query("SELECT run_id::text, seq, hash FROM journal_events"))

    kill_postmaster(primary)
    killed_at = time.monotonic()
    on_standby = _completed_steps(standby)  # a hot standby still serves reads
    promote(standby)
    promoted = time.monotonic() - killed_at
    stack.postgres = standby  # the test's own reads go there too
    _first(lambda: _completed_steps(standby) > on_standby, within=120, what="a step completed")
    progress = time.monotonic() - killed_at
    made, _ = _first(
        lambda: (r := client.post_run("failover", 100)).status_code == 201 and r, within=120, what="POST /runs 201"
    )
    serving = time.monotonic() - killed_at
    after = [made.json()["id"], *(client.post_run("failover", 101 + n).json()["id"] for n in range(RUNS_AFTER - 1))]
    print(
        f"failover: promoted {promoted:.2f}s after the kill; first step completed {progress:.2f}s after it; "
        f"POST /runs answered 201 by {serving:.2f}s after it; {len(committed)} journal rows committed before it"
    )

    everything = [*in_flight, *after]
    stack.wait_succeeded(everything, timeout=180)
    # Nothing the primary had committed is lost: every row is on the promoted standby, the same row.
    kept = set(stack.query("SELECT run_id::text, seq, hash FROM journal_events"))
    assert committed <= kept, sorted(committed - kept)[:5]
    _each_step_once(stack, everything)
    completed = stack.query(
        "SELECT count(*) FROM journal_events WHERE kind = 'step_completed' AND run_id::text = ANY(%s)", (everything,)
    )[0][0]
    assert completed == len(everything) * STEPS
    # Each model call billed once (a call cut off by the kill was sent again under its key: replayed, not billed).
    assert set(llm_provider.billed.values()) == {1} and len(llm_provider.billed) == 2 * len(everything)
    # One webhook per run, under its one key; a key delivered again is a delivery the kill cut off before its
    # step_completed, sent again under the same key (the receiver dedups by it), never a new attempt.
    assert set(webhook_receiver.dedup) == {f"{run_id}:notify:1" for run_id in everything}, webhook_receiver.dedup
    again = [k for k, count in webhook_receiver.dedup.items() if count > 1]
    for key in again:
        run_id = key.split(":")[0]
        resumed = stack.query(
            "SELECT count(*) FROM journal_events WHERE run_id::text = %s AND step_id = 'notify' "
            "AND kind = 'step_started' AND (payload->>'resumed')::boolean",
            (run_id,),
        )[0][0]
        assert resumed >= 1, (key, webhook_receiver.dedup)
    # The same processes did it all, none restarted.
    assert all(worker.alive for worker in stack.workers), stack.workers
    assert stack.beat.poll() is None
    os.kill(stack.base.pid, 0)
    print(f"failover: webhooks delivered again under their key: {len(again)}")

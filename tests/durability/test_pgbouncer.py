"""The engine behind a real PgBouncer in transaction pooling mode (PAL_DB_PGBOUNCER=true): a worker killed (kill -9)
in the middle of a step, and Postgres restarted under PgBouncer, lose no step and do none twice.

A private Postgres with a PgBouncer in front (tests.durability.private_stack, tests/support/pgbouncer.py): every
worker, the beat, the web process and every `manage.py` reach Postgres through it; the test reads the journal on
Postgres itself.
Two workers of two processes each share PgBouncer's server connections, so one transaction after another of a
worker lands on another server connection: a prepared statement or a holdable cursor would not be there.
"""

from __future__ import annotations

import httpx
import psycopg
import pytest

from tests.durability.private_stack import Stack
from tests.durability.test_database_away import Client, _first
from tests.durability.test_postgres_restart import (
    _idle_workers_with_six_runs_done,
    _ten_runs_finish_and_the_sweep_works_again,
)
from tests.helpers import hold_calls_containing, wait_until
from tests.support.peers import default_reply

pytestmark = pytest.mark.integration

DRAFTS = {
    "name": "drafts",
    "steps": [
        {"id": "outline", "kind": "tool_call", "tool": "echo", "args": {"n": "{{ input.n }}"}},
        {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "DRAFT n={{ input.n }};"},
        {"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 0.2}},
        {"id": "final", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "FINAL n={{ input.n }};"},
    ],
}


@pytest.fixture
def stack(tmp_path, llm_provider):
    stack = Stack(tmp_path, workers=2, concurrency=2, pgbouncer=True, env=llm_provider.env())
    try:
        stack.start()
        stack.shell(f"from runs.services import workflow_create; workflow_create(definition={DRAFTS!r})")
        yield stack
    finally:
        stack.close()


def _each_step_done_once(stack: Stack, run_ids: list[str], steps: int) -> None:
    done = stack.query(
        "SELECT run_id::text, step_id, count(*) FROM journal_events WHERE kind = 'step_completed' "
        "AND run_id::text = ANY(%s) GROUP BY run_id, step_id",
        (run_ids,),
    )
    assert len(done) == len(run_ids) * steps, done  # none lost
    assert [row for row in done if row[2] != 1] == [], done  # none twice


def test_a_worker_killed_mid_step_behind_pgbouncer_is_recovered_and_each_call_is_billed_once(stack, llm_provider):
    hold_calls_containing(llm_provider, "DRAFT n=0;", seconds=60)
    held, *others = stack.post_runs(6, workflow="drafts")
    draft_key = f"{held}:draft:1"
    wait_until(
        lambda: any(c.idempotency_key == draft_key for c in llm_provider.requests),
        timeout=60,
        what="the held run's draft call at the provider",
    )
    (owner,) = stack.query("SELECT owner FROM run_locks WHERE run_id::text = %s", (held,))[0]
    (victim,) = [w for w in stack.workers if owner.startswith(w.name + ":")]

    victim.kill()
    llm_provider.reply, llm_provider.delay = default_reply, 0.0

    stack.wait_succeeded([held, *others], timeout=120)
    _each_step_done_once(stack, [held, *others], steps=len(DRAFTS["steps"]))
    # Each model call billed once: the interrupted one was sent again under its key and replayed by the provider.
    assert set(llm_provider.billed.values()) == {1} and len(llm_provider.billed) == 2 * 6, llm_provider.billed
    redriven = stack.query(
        "SELECT payload->>'by' FROM journal_events WHERE kind = 'run_redriven' AND run_id::text = %s", (held,)
    )
    assert redriven and {by for (by,) in redriven} == {"sweep"}, redriven
    assert all(w.alive for w in stack.workers if w is not victim), stack.workers


def _pgbouncer_lets_clients_in(stack: Stack) -> None:
    """After a server login failed while Postgres was down, PgBouncer refuses clients for server_login_retry (1 s),
    as the web's 503 tells a client to retry: this test's own client (manage.py) waits that out, the workers do not."""

    def lets_in() -> bool:
        try:
            with psycopg.connect(stack.database_url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    wait_until(lets_in, timeout=30, what="PgBouncer to let a client in")


def test_runs_posted_after_postgres_restarted_under_pgbouncer_finish(stack):
    _idle_workers_with_six_runs_done(stack)

    stack.postgres.restart(mode="fast")
    back_at = stack.database_now()
    _pgbouncer_lets_clients_in(stack)

    _ten_runs_finish_and_the_sweep_works_again(stack, back_at=back_at)
    assert all(w.alive for w in stack.workers), stack.workers  # the same processes, through the same PgBouncer


def test_runs_in_flight_when_postgres_restarts_under_pgbouncer_each_step_once(stack, llm_provider):
    in_flight = stack.post_runs(8, workflow="drafts")
    wait_until(
        lambda: stack.query("SELECT count(*) FROM journal_events WHERE kind = 'step_completed'")[0][0] >= 4,
        timeout=60,
        what="the runs under way",
    )

    stack.postgres.restart(mode="fast")

    stack.wait_succeeded(in_flight, timeout=120)
    _each_step_done_once(stack, in_flight, steps=len(DRAFTS["steps"]))
    assert set(llm_provider.billed.values()) == {1} and len(llm_provider.billed) == 2 * 8, llm_provider.billed
    assert all(w.alive for w in stack.workers), stack.workers


def test_the_web_process_behind_pgbouncer_serves_the_api_the_pages_and_a_stream_across_a_restart(stack):
    # uvicorn's pool, its request threads, the event stream's threads and the drive sender, all through PgBouncer.
    stack.clients = []
    stack.base = stack.web()
    stack.token, stack.session = stack.operator()
    client = Client(stack)
    try:
        posted = [client.post_run("drafts", n, key=f"before-{n}") for n in range(3)]
        assert [p.status_code for p in posted] == [201] * 3, [p.text for p in posted]
        before = [p.json()["id"] for p in posted]
        stack.wait_succeeded(before, timeout=120)
        _streamed_to_the_end(stack, before[0])
        assert client.page(f"/runs/{before[0]}/").status_code == 200

        stack.postgres.restart(mode="fast")

        made, took = _first(
            lambda: (r := client.post_run("drafts", 10, key="after-10")).status_code == 201 and r,
            within=60,
            what="POST /runs 201 after the restart",
        )
        print(f"behind PgBouncer, the web served a POST again {took:.2f} s after Postgres restarted")
        again = client.post_run("drafts", 10, key="after-10")  # the same key: the same run, not a second one
        assert again.status_code == 200 and again.json()["id"] == made.json()["id"]
        stack.wait_succeeded([made.json()["id"]], timeout=120)
        assert client.get_run(made.json()["id"]).json()["status"] == "succeeded"
        assert client.page("/runs/").status_code == 200
        _each_step_done_once(stack, [*before, made.json()["id"]], steps=len(DRAFTS["steps"]))
    finally:
        for page_client in stack.clients:
            page_client.close()


def _streamed_to_the_end(stack: Stack, run_id: str) -> None:
    """The run's event stream replays every row and closes, as the run has ended."""
    url = f"{stack.base}/api/v1/runs/{run_id}/events/stream"
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30) as response:
        assert response.status_code == 200
        kinds = [line.removeprefix("event: ") for line in response.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "run_created" and kinds[-1] == "run_succeeded", kinds

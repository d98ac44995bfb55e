"""Postgres restarts (or is away for 30 s) while the workers are idle: the next runs must still finish.

A private PostgreSQL cluster and Redis (tests/support/servers.py), never the shared ones: the test restarts and
stops its server. Two real `celery -A pal worker` processes and a real `celery -A pal beat` run against them; the
runs are created and /health is asked by `manage.py shell` subprocesses on the same DATABASE_URL, as an operator
or the web app would. Before the fix, every worker kept its dead connection: each drive and sweep task failed with
`OperationalError: the connection is closed` and none of the runs posted after the restart ever started.
"""

from __future__ import annotations

import time

import pytest

from tests.durability.private_stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path):
    stack = Stack(tmp_path)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()


def _idle_workers_with_six_runs_done(stack: Stack):
    first = stack.post_runs(6)
    stack.wait_succeeded(first, timeout=90)
    time.sleep(1)  # the workers sit idle on their kept connections


def _ten_runs_finish_and_the_sweep_works_again(stack: Stack, *, back_at):
    later = stack.post_runs(10)
    stack.wait_succeeded(later, timeout=120)
    deadline = time.monotonic() + 60
    while not stack.last_sweep_finished_after(back_at):
        assert time.monotonic() < deadline, "no recovery sweep finished after Postgres came back"
        time.sleep(0.5)
    status, body = stack.health()
    assert (status, body["database"], body["broker"], body["sweep"]) == (200, "ok", "ok", "ok"), body


def test_runs_posted_after_an_idle_postgres_restart_finish(stack):
    _idle_workers_with_six_runs_done(stack)

    stack.postgres.restart(mode="fast")
    back_at = stack.database_now()

    _ten_runs_finish_and_the_sweep_works_again(stack, back_at=back_at)


def test_runs_posted_after_postgres_was_away_for_30_seconds_finish(stack):
    _idle_workers_with_six_runs_done(stack)

    stack.postgres.stop(mode="fast")
    down_at = time.monotonic()
    status, body = stack.health()
    assert status == 503 and body["database"] == "error", body
    assert any(p.startswith("database") for p in body["problems"]), body
    time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
    stack.postgres.start()
    back_at = stack.database_now()

    _ten_runs_finish_and_the_sweep_works_again(stack, back_at=back_at)

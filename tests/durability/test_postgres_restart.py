"""Postgres restarts (or is away for 30 s) while the workers are idle: the next runs must still finish.

A private PostgreSQL cluster and Redis (tests/support/servers.py), never the shared ones: the test restarts and
stops its server. Two real `celery -A pal worker` processes and a real `celery -A pal beat` run against them; the
runs are created and /health is asked by `manage.py shell` subprocesses on the same DATABASE_URL, as an operator
or the web app would. Before the fix, every worker kept its dead connection: each drive and sweep task failed with
`OperationalError: the connection is closed` and none of the runs posted after the restart ever started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import psycopg
import pytest

from tests.durability.helpers import QUICK
from tests.support import workers as worker_support
from tests.support.servers import start_postgres, start_redis

pytestmark = pytest.mark.integration

RECOVERY_INTERVAL = 1
WORKFLOW = {
    "name": "pg-restart",
    "steps": [
        {"id": "first", "kind": "tool_call", "tool": "echo", "args": {"n": "{{ input.n }}"}},
        {"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 0.05}},
        {"id": "last", "kind": "llm_call", "model": "fake", "provider": "fake", "prompt": "n={{ input.n }}"},
    ],
}


class Stack:
    """A private Postgres and Redis, two workers and beat on them; everything the test process asks goes through
    subprocesses or psycopg on the private DATABASE_URL (the test's own Django database is not involved)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.postgres = start_postgres(tmp_path)
        self.redis = start_redis(tmp_path)
        self.env = {
            "DATABASE_URL": self.postgres.url,
            "CELERY_BROKER_URL": self.redis.url,
            "DJANGO_SECRET_KEY": "test-only-insecure-key",
            "DJANGO_SETTINGS_MODULE": "pal.settings",
            "PAL_VAR_DIR": str(tmp_path / "var"),
            "PAL_LEASE_TTL": "2",
            "PAL_RECOVERY_INTERVAL": str(RECOVERY_INTERVAL),
        }
        self.workers: list[worker_support.Worker] = []
        self.beat: subprocess.Popen | None = None

    # --- processes ---------------------------------------------------------------------------------

    def start(self):
        self.manage("migrate", "--noinput")
        self.shell(f"from runs.services import workflow_create; workflow_create(definition={WORKFLOW!r})")
        for n in (1, 2):
            self.workers.append(
                worker_support.start_worker(
                    name=f"pgr{n}-{uuid.uuid4().hex[:6]}",
                    base_env=self.env,
                    log_dir=self.tmp_path / "logs",
                    **QUICK,
                )
            )
        beat_log = open(self.tmp_path / "logs" / "beat.log", "ab")
        self.beat = subprocess.Popen(
            [
                worker_support.python_executable(),
                "-m",
                "celery",
                "-A",
                "pal",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(self.tmp_path / "beat-schedule"),
            ],
            cwd=worker_support.REPO_ROOT,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=beat_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        beat_log.close()

    def close(self):
        for worker in self.workers:
            worker.kill()
            print(f"----- {worker.name} -----\n{worker.log_tail(80)}")  # shown when the test fails
        if self.beat is not None:
            try:
                os.killpg(self.beat.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.beat.wait(10)
        self.redis.stop()
        self.postgres.destroy()

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [worker_support.python_executable(), "manage.py", *args],
            cwd=worker_support.REPO_ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code)

    # --- what the test asks ------------------------------------------------------------------------

    def post_runs(self, count: int) -> list[str]:
        """Create `count` runs as the API would (run_create: the first task goes to the broker on commit)."""
        out = self.shell(
            "import json\nfrom runs.services import run_create\n"
            f"print(json.dumps([str(run_create(workflow_name={WORKFLOW['name']!r}, input={{'n': n}})[0].id) "
            f"for n in range({count})]))"
        )
        return json.loads(out.strip().splitlines()[-1])

    def health(self) -> tuple[int, dict]:
        """GET /api/v1/health in a process of its own, as the web app answers it."""
        out = self.shell(
            "import json\nfrom django.test import Client\n"
            "r = Client(HTTP_HOST='127.0.0.1').get('/api/v1/health')\n"
            "print(json.dumps([r.status_code, r.json()]))"
        )
        status, body = json.loads(out.strip().splitlines()[-1])
        return status, body

    def query(self, sql: str, params=()) -> list[tuple]:
        with psycopg.connect(self.postgres.url, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def statuses(self, run_ids: list[str]) -> dict[str, int]:
        rows = self.query("SELECT status, count(*) FROM runs WHERE id::text = ANY(%s) GROUP BY status", (run_ids,))
        return dict(rows)

    def wait_succeeded(self, run_ids: list[str], *, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.statuses(run_ids)
            if statuses.get("succeeded") == len(run_ids):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {w.name}\n{w.log_tail(30)}" for w in self.workers)
                raise AssertionError(f"after {timeout}s the {len(run_ids)} runs are {statuses}\n{logs}")
            time.sleep(0.2)

    def last_sweep_finished_after(self, moment) -> bool:
        rows = self.query("SELECT count(*) FROM sweeps WHERE finished_at > %s", (moment,))
        return rows[0][0] > 0

    def database_now(self):
        return self.query("SELECT now()")[0][0]


@pytest.fixture
def stack(tmp_path):
    (tmp_path / "logs").mkdir()
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

"""A private PostgreSQL and Redis (tests/support/servers.py) with real workers, beat and, when asked, a real uvicorn
web process on them: for the tests that stop, start or restart a server (never the shared ones others test against).
With pgbouncer=True every process reaches Postgres through a real PgBouncer in transaction pooling mode
(tests/support/pgbouncer.py, PAL_DB_PGBOUNCER=true); with broker="rabbitmq" the broker is a RabbitMQ of its own
(tests/support/rabbitmq.py) instead of the Redis (`redis` names whichever it is).

Everything the test process asks goes through subprocesses (`manage.py shell`), psycopg on the private DATABASE_URL
or HTTP to the web process: the test's own Django database is not involved.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid

import psycopg

from tests.helpers import QUICK
from tests.support import workers as worker_support
from tests.support.pgbouncer import start_pgbouncer
from tests.support.rabbitmq import start_rabbitmq
from tests.support.servers import DATABASE, start_postgres, start_redis
from tests.support.web import uvicorn_server

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
    """A private Postgres and Redis, `workers` workers (of `concurrency` processes) and beat on them (start());
    web() adds a uvicorn. `env` goes to every process (a peer's address, say)."""

    def __init__(
        self, tmp_path, *, workers: int = 2, concurrency: int = 1, pgbouncer: bool = False, broker="redis", env=None
    ):
        self.tmp_path = tmp_path
        (tmp_path / "logs").mkdir(exist_ok=True)
        self.postgres = start_postgres(tmp_path)
        try:
            self.pgbouncer = start_pgbouncer(tmp_path, self.postgres) if pgbouncer else None
            self.redis = (start_rabbitmq if broker == "rabbitmq" else start_redis)(tmp_path)
        except BaseException:
            if getattr(self, "pgbouncer", None) is not None:
                self.pgbouncer.stop()
            self.postgres.destroy()
            raise
        self.worker_count, self.concurrency = workers, concurrency
        self.database_url = self.pgbouncer.url_for(DATABASE) if self.pgbouncer else self.postgres.url
        self.env = {
            **({"PAL_DB_PGBOUNCER": "true"} if self.pgbouncer else {}),
            **(env or {}),
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.redis.url,
            "DJANGO_SECRET_KEY": "test-only-insecure-key",
            "DJANGO_SETTINGS_MODULE": "pal.settings",
            "PAL_VAR_DIR": str(tmp_path / "var"),
            "PAL_LEASE_TTL": "2",
            "PAL_RECOVERY_INTERVAL": str(RECOVERY_INTERVAL),
        }
        self.workers: list[worker_support.Worker] = []
        self.beat: subprocess.Popen | None = None
        self._web = contextlib.ExitStack()

    # --- processes ---------------------------------------------------------------------------------

    def start(self):
        self.manage("migrate", "--noinput")
        self.shell(f"from runs.services import workflow_create; workflow_create(definition={WORKFLOW!r})")
        for n in range(1, self.worker_count + 1):
            self.workers.append(
                worker_support.start_worker(
                    name=f"pgr{n}-{uuid.uuid4().hex[:6]}",
                    concurrency=self.concurrency,
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

    def web(self) -> str:
        """Start a uvicorn serving pal.asgi on the private servers; returns its base URL."""
        env = {key: value for key, value in self.env.items() if key != "DATABASE_URL"}
        return self._web.enter_context(
            uvicorn_server(database_url=self.database_url, env=env, log_dir=self.tmp_path / "web")
        )

    def close(self):
        self._web.close()
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
        if self.pgbouncer is not None:
            self.pgbouncer.stop()
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

    def last_line(self, code: str):
        """The JSON the code printed on its last line."""
        return json.loads(self.shell(code).strip().splitlines()[-1])

    # --- what the test asks ------------------------------------------------------------------------

    def operator(self) -> tuple[str, str]:
        """(an API token, a page session id) of a new operator."""
        return self.last_line(
            "import json\nfrom django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY\n"
            "from django.contrib.auth.models import Permission, User\n"
            "from django.contrib.sessions.backends.db import SessionStore\n"
            "from tokens.services import token_create\n"
            "user = User.objects.create_user(username='otto')\n"
            "user.user_permissions.add(*Permission.objects.filter(codename__in=['view_run', 'operate']))\n"
            "session = SessionStore()\n"
            "session[SESSION_KEY], session[HASH_SESSION_KEY] = str(user.pk), user.get_session_auth_hash()\n"
            "session[BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend'\n"
            "session.create()\n"
            "print(json.dumps([token_create(user=user, name='test')[1], session.session_key]))"
        )

    def post_runs(self, count: int, workflow: str = WORKFLOW["name"]) -> list[str]:
        """Create `count` runs (input n = 0, 1, ...) as the API would (run_create: the first task goes to the broker
        on commit)."""
        return self.last_line(
            "import json\nfrom runs.services import run_create\n"
            f"print(json.dumps([str(run_create(workflow_name={workflow!r}, input={{'n': n}})[0].id) "
            f"for n in range({count})]))"
        )

    def health(self) -> tuple[int, dict]:
        """GET /api/v1/health in a process of its own, as the web app answers it."""
        status, body = self.last_line(
            "import json\nfrom django.test import Client\n"
            "r = Client(HTTP_HOST='127.0.0.1').get('/api/v1/health')\n"
            "print(json.dumps([r.status_code, r.json()]))"
        )
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

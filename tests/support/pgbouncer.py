"""A real PgBouncer in transaction pooling mode in front of a throwaway Postgres (tests/support/servers.py).

    start_pgbouncer(tmpdir, postgres) -> PgBouncer   .url_for(database), .stop()

It listens on a free port of 127.0.0.1, routes every database name to the cluster, and authenticates the
cluster's user by its password (SCRAM, both sides), as a production PgBouncer does. PgBouncer refuses to run as
root, so as root it runs as the user `postgres` (`runuser`), like the cluster. Not installed or not starting is a
ServerError (its log's tail): a test through it fails, never skips.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.servers import PASSWORD, READY_TIMEOUT, USER, Postgres, ServerError, _as_root, _tail, free_port

BINARY = "/usr/sbin/pgbouncer"


class PgBouncer:
    """One pgbouncer process, pool_mode=transaction. ``url_for(db)`` is a DATABASE_URL through it."""

    def __init__(self, root: Path, port: int, postgres: Postgres):
        self.root = root
        self.port = port
        self.postgres = postgres
        self.log = root / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None

    def __repr__(self):
        return f"<PgBouncer 127.0.0.1:{self.port} -> {self.postgres.port}>"

    def url_for(self, database: str) -> str:
        return f"postgres://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def _config(self) -> Path:
        (self.root / "userlist.txt").write_text(f'"{USER}" "{PASSWORD}"\n')
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.postgres.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = scram-sha-256\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            # Many worker processes and threads share a few server connections (the point of a pooler), so one
            # transaction after another of a client lands on another server connection.
            "max_client_conn = 500\n"
            "default_pool_size = 3\n"
            # A query waiting for a server (say while Postgres restarts) fails after this, not PgBouncer's 120 s.
            "query_wait_timeout = 30\n"
            # After a failed login to the server (Postgres restarting) PgBouncer refuses every client for this
            # long without trying the server again: 15 s by default, a quarter of a minute of errors after a restart.
            "server_login_retry = 1\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
        )
        return ini

    def start(self):
        if not Path(BINARY).exists():
            raise ServerError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.root.mkdir(parents=True, exist_ok=True)
        ini = self._config()
        cmd = [BINARY, str(ini)]
        if _as_root():
            for path in (self.root, *self.root.iterdir()):
                shutil.chown(path, "postgres")
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        with open(self.root / "pgbouncer.err", "ab") as err:
            self.proc = subprocess.Popen(
                cmd, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._answers():
            if self.proc.poll() is not None:
                errors = _tail(self.root / "pgbouncer.err")
                raise ServerError(f"pgbouncer exited with {self.proc.returncode}:\n{_tail(self.log)}\n{errors}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"pgbouncer on 127.0.0.1:{self.port} not ready after {READY_TIMEOUT:.0f}s")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)  # runuser passes it on; pgbouncer exits at once on SIGTERM
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(15)


def start_pgbouncer(tmpdir: str | Path, postgres: Postgres) -> PgBouncer:
    """Start a PgBouncer (transaction pooling) on a free port of 127.0.0.1 in front of `postgres`."""
    root = postgres.root / "pgbouncer" if _as_root() else Path(tmpdir) / "pgbouncer"
    bouncer = PgBouncer(root, free_port(), postgres)
    bouncer.start()
    return bouncer

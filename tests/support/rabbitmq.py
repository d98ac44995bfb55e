"""A throwaway RabbitMQ (Debian's rabbitmq-server) on free loopback ports, for the tests that run the broker-loss
tests on RabbitMQ too.

    start_rabbitmq(tmpdir) -> RabbitMQ   .url (amqp://guest:guest@127.0.0.1:PORT//), .queue_length(q), .stop()

Everything is its own: the node's name, its data and logs under tmpdir (RABBITMQ_MNESIA_BASE, RABBITMQ_LOG_BASE),
its AMQP and distribution ports, and an epmd on a port of its own (ERL_EPMD_PORT), stopped with it; no plugin.
It runs as whoever runs the tests (root too: unlike Postgres, RabbitMQ does not refuse it). Not installed or not
starting is a ServerError with its log's tail: a test on it fails, never skips.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.servers import ServerError, _tail, free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
READY_TIMEOUT = 90.0  # the Erlang node boots in 5-15 s on a loaded 2-core machine


class RabbitMQ:
    def __init__(self, root: Path):
        self.root = root
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.node = f"pal-test-{self.port}@localhost"
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def __repr__(self):
        return f"<RabbitMQ 127.0.0.1:{self.port} {self.node}>"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),  # the Erlang cookie goes here
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq"),  # .conf is appended: none there, the defaults
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid"),
        }

    def start(self):
        if not Path(SERVER).exists():
            raise ServerError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        for sub in ("mnesia", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        cmd = [SERVER]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._answers():
            if self.proc.poll() is not None:
                self._stop_epmd()
                raise ServerError(f"rabbitmq-server exited with {self.proc.returncode}:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"RabbitMQ on 127.0.0.1:{self.port} not ready after {READY_TIMEOUT:.0f}s:\n{_tail(self.log)}"
                )
            time.sleep(0.2)

    def _answers(self) -> bool:
        import kombu

        try:
            with kombu.Connection(self.url, connect_timeout=1) as conn:
                conn.connect()
                return True
        except Exception:
            return False

    def queue_length(self, queue: str = "celery") -> int:
        """How many messages wait on `queue` (0 when nobody declared it yet)."""
        import kombu
        from amqp.exceptions import NotFound

        with kombu.Connection(self.url, connect_timeout=5) as conn:
            try:
                return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
            except NotFound:
                return 0

    def stop(self):
        """Stop the node (SIGTERM: Erlang's orderly shutdown) and its epmd."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)
        self._stop_epmd()

    def _stop_epmd(self):
        # epmd was started by the node as a daemon, outside its process group: ask it to go, on its own port.
        subprocess.run(
            ["epmd", "-port", str(self.epmd_port), "-kill"], env=self._env(), capture_output=True, timeout=15
        )


def start_rabbitmq(tmpdir: str | Path) -> RabbitMQ:
    broker = RabbitMQ(Path(tmpdir) / "rabbitmq")
    broker.start()
    return broker

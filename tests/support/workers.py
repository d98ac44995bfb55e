"""Real Celery worker processes for integration tests: start them, stop them, kill -9 them.

Each worker is started in a session of its own (``start_new_session=True``), so it leads a process group
holding the main process, its prefork children and anything they spawn (agents). ``kill()`` sends
SIGKILL to that whole group: the nearest thing to pulling the plug on a machine.

The workers must share the test's database and broker: ``database_url()`` turns the connection the test
uses (the test database, under ``django_db(transaction=True)``) into a DATABASE_URL for them.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parents[2]

_live: set[Worker] = set()  # killed at exit too, should a test's teardown never run


def python_executable() -> str:
    venv_python = REPO_ROOT / ".venv" / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def database_url(settings_dict: dict | None = None) -> str:
    """A postgres:// URL for the database behind ``settings_dict`` (default: Django's default connection,
    which inside a pytest-django test is the test database)."""
    if settings_dict is None:
        from django.db import connection

        settings_dict = connection.settings_dict
    engine = settings_dict["ENGINE"]
    if "postgresql" not in engine:
        raise RuntimeError(f"worker processes need a shared Postgres database; this test runs on {engine}")
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{credentials}{host}:{port}/{quote(settings_dict['NAME'], safe='')}"


def broker_url() -> str:
    from django.conf import settings

    return os.environ.get("CELERY_BROKER_URL") or settings.CELERY_BROKER_URL


class Worker:
    """One ``celery -A pal worker`` process group. The log (stdout and stderr) is in ``log_path``."""

    def __init__(self, proc: subprocess.Popen, name: str, log_path: Path, log_file):
        self.proc = proc
        self.name = name  # the node name is f"{name}@{hostname}"
        self.log_path = log_path
        self._log_file = log_file

    def __repr__(self):
        return f"<Worker {self.name} pid={self.proc.pid} returncode={self.proc.returncode}>"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    # --- signals to the whole process group --------------------------------------------------------

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.proc.pid, sig)  # the group id is the leader's pid (start_new_session)
            return True
        except ProcessLookupError:
            return False

    def kill(self, timeout: float = 10.0):
        """SIGKILL the main process and all its children at once: no shutdown code runs."""
        self._signal_group(signal.SIGKILL)
        self._reap(timeout)

    def stop_signal(self):
        """SIGSTOP the group: the worker freezes (no heartbeat, no progress) but keeps its connections."""
        self._signal_group(signal.SIGSTOP)

    def cont(self):
        """SIGCONT the group after ``stop_signal()``."""
        self._signal_group(signal.SIGCONT)

    def terminate(self, timeout: float = 30.0):
        """SIGTERM (Celery's warm shutdown: finish the current task, then exit); SIGKILL if it takes longer."""
        self._signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _reap(self, timeout: float):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self} did not die after SIGKILL") from None
        # Children of the group (prefork pool, agents) may outlive the leader for a moment.
        deadline = time.monotonic() + timeout
        while self._signal_group(0) and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)
        _live.discard(self)
        if not self._log_file.closed:
            self._log_file.close()

    # --- readiness and logs ------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """Wait until the log matches the regular expression ``pattern``; fails with the log's tail."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            if not self.alive:
                raise RuntimeError(f"{self} exited before its log matched {pattern!r}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self}: no {pattern!r} in the log after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def wait_ready(self, timeout: float = 60.0):
        """Wait until the worker consumes from the broker (its log says 'ready' or it answers a ping)."""
        from pal.celery import app

        deadline = time.monotonic() + timeout
        next_ping = time.monotonic() + 1.0
        while True:
            if re.search(rf"{re.escape(self.name)}@\S+ ready\.", self.log_text()):
                return self
            if not self.alive:
                raise RuntimeError(f"{self} exited while starting:\n{self.log_tail()}")
            if time.monotonic() > next_ping:
                replies = app.control.ping(destination=[self.node_name], timeout=0.5, limit=1) or []
                if any(self.node_name in reply for reply in replies):
                    return self
                next_ping = time.monotonic() + 1.0
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self} not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    @property
    def node_name(self) -> str:
        import socket

        return f"{self.name}@{socket.gethostname()}"

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def start_worker(
    env_overrides: dict[str, str] | None = None,
    *,
    concurrency: int = 1,
    name: str | None = None,
    base_env: dict[str, str] | None = None,
    log_dir: str | Path | None = None,
    extra_args: tuple[str, ...] = (),
    wait: bool = True,
    ready_timeout: float = 60.0,
) -> Worker:
    """Start ``celery -A pal worker`` in its own process group from the repo root.

    The environment is this process's, then ``base_env`` (usually the ``worker_env`` fixture), then
    ``env_overrides``. With ``wait`` (the default) it returns once the worker is ready.
    Prefer the ``celery_workers`` fixture, which also kills the workers at teardown.
    """
    name = name or f"w-{uuid.uuid4().hex[:8]}"
    chosen = {**(base_env or {}), **(env_overrides or {})}
    env = {**os.environ, "PAL_WORKER_NAME": name, **chosen}  # lease owners name the worker, unless told
    env.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
    env["PYTHONUNBUFFERED"] = "1"
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pal-worker-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = open(log_path, "ab")
    cmd = [
        python_executable(),
        "-m",
        "celery",
        "-A",
        "pal",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "-n",
        f"{name}@%h",
        *extra_args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = Worker(proc, name, log_path, log_file)
    _live.add(worker)
    if wait:
        try:
            worker.wait_ready(ready_timeout)
        except BaseException:
            worker.kill()
            raise
    return worker


def kill_all():
    """SIGKILL every worker this process started and has not reaped yet."""
    for worker in list(_live):
        try:
            worker.kill()
        except Exception:
            pass


atexit.register(kill_all)


def start_beat(env: dict[str, str], log_dir: Path, name: str = "beat") -> subprocess.Popen:
    """Start ``celery -A pal beat`` in its own process group, logging to log_dir/NAME.log; stop it with stop_beat."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            [
                python_executable(),
                *("-m", "celery", "-A", "pal", "beat", "--loglevel", "INFO"),
                *("-s", str(log_dir / f"{name}-schedule")),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "pal.settings", **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_beat(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)

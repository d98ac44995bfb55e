"""A real web server for integration tests: uvicorn serving pal.asgi (the production ASGI app) on a free port of
127.0.0.1, against the test's database and broker. Used by the event-stream tests and the browser tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support import workers as worker_support


class LiveServer(str):
    """The server's base URL (a str, no trailing slash), with the pid of the uvicorn serving it."""

    pid: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def uvicorn_server(
    *,
    database_url: str,
    log_dir: Path,
    env: dict[str, str] | None = None,
    ready_path: str = "/api/v1/openapi.json",
    timeout: float = 30.0,
) -> Iterator[LiveServer]:
    """Start `uvicorn pal.asgi:application` and yield its base URL once `ready_path` answers 200; kill it after.
    Its log is printed at the end (pytest shows it when a test failed)."""
    port = free_port()
    full_env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": worker_support.broker_url(),
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or "test-only-insecure-key",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "uvicorn.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                worker_support.python_executable(),
                "-m",
                "uvicorn",
                "pal.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--lifespan",
                "off",
                "--no-access-log",
            ],
            cwd=worker_support.REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = LiveServer(f"http://127.0.0.1:{port}")
    base.pid = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(base + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        proc.kill()
        proc.wait(10)
        print(f"----- uvicorn log -----\n{log_path.read_text()[-5000:]}")

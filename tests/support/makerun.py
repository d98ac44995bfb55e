"""`make run` in a temp folder: the embedded default (SQLite, the file broker) as a newcomer starts it.

`MakeRun(home)` runs `python -m pal.devrun` (what `make run` runs, with the Makefile's variables) with its var
folder, metrics folder and receipt key under `home`, on a free port; `home / "checkout"` stands in for the
reader's checkout (`.venv` and `manage.py` link to this one's, and PYTHONPATH makes it importable, as the checkout
is under `make run`). `env()` is the environment a second terminal in that checkout has."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


class MakeRun:
    def __init__(self, home: Path):
        self.home = home
        self.var = home / "var"
        self.checkout = home / "checkout"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.checkout.mkdir(parents=True, exist_ok=True)
        for name in (".venv", "manage.py"):
            (self.checkout / name).symlink_to(ROOT / name)
        self.var.mkdir(exist_ok=True)
        key = home / "receipt-key.pem"
        subprocess.run(
            [sys.executable, "manage.py", "pal_receipt_key", "--out", str(key)],
            cwd=ROOT,
            env=self.env(),
            check=True,
            capture_output=True,
        )
        self.key = key

    def env(self, **more: str) -> dict[str, str]:
        """A second terminal's environment: no server's URL, the temp var folder, the checkout importable."""
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
        env.update(
            PAL_VAR_DIR=str(self.var),
            PYTHONPATH=str(self.checkout),
            DJANGO_SECRET_KEY=env.get("DJANGO_SECRET_KEY") or "test-only-insecure-key",
        )
        env.pop("PAL_WORKFLOW_MODULES", None)
        env.update(more)
        return env

    def start(self, **more: str) -> None:
        """Start it (the Makefile's variables, then `more`) and wait until the web app answers."""
        self.starts += 1
        metrics = self.home / f"prometheus-{self.starts}"
        metrics.mkdir()
        env = self.env(
            DJANGO_DEBUG="1",
            PAL_RECOVERY_INTERVAL="5",
            PAL_LEASE_TTL="10",
            PORT=str(self.port),
            PROMETHEUS_MULTIPROC_DIR=str(metrics),
            PAL_RECEIPT_PRIVATE_KEY_FILE=str(self.key),
            **more,
        )
        with (self.home / f"make-run-{self.starts}.log").open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pal.devrun"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"make run stopped ({self.proc.returncode}):\n{self.tail()}")
            if (self.var / "worker.pid").exists() and self._answers():
                return
            time.sleep(0.5)
        raise AssertionError(f"make run did not come up in 120 s:\n{self.tail()}")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/health", timeout=2)
        except urllib.error.HTTPError:
            return True  # it answers, whatever it says
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Ctrl-C: make run stops its web app, worker and beat."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        (self.var / "worker.pid").unlink(missing_ok=True)
        self.proc = None

    def tail(self, lines: int = 40) -> str:
        path = self.home / f"make-run-{self.starts}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def query(self, sql: str, *args) -> list[tuple]:
        """Read the SQLite database make run writes, as a second process does."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.var / 'pal.sqlite3'}?mode=ro", uri=True, timeout=20)
        ) as db:
            return db.execute(sql, args).fetchall()

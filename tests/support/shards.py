"""`python -m tests.support.shards`: make test's passes, the suite split in shards that run at once.

Each shard is `python -m tests.support.servers run -- sh -c "pytest FILES"`: its own throwaway Postgres and
Redis, so shards share no database, broker or test database name. Files go to the shard with the least time so
far, largest first, by tests/support/durations.json (seconds per file, written by a run with PAL_TEST_DURATIONS
set; a file it does not list counts DEFAULT_SECONDS). The last shard runs `make test-sqlite` first (its seconds
counted as SQLITE_SECONDS). PAL_TEST_SHARDS (default 2; 1: one pass, as before) sets how many; with DATABASE_URL or
CELERY_BROKER_URL set, their servers are shared, so there is one shard. Each shard's output is printed whole once
it ends; the exit status is the first failing shard's, else 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURATIONS = ROOT / "tests" / "support" / "durations.json"
DEFAULT_SECONDS = 3.0
SQLITE_SECONDS = 90.0


def test_files() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py"))


def split(files: list[str], durations: dict[str, float], shards: int) -> list[list[str]]:
    """Files in `shards` lists of about equal time: each, largest first, to the lightest list so far."""
    loads = [0.0] * shards
    out: list[list[str]] = [[] for _ in range(shards)]
    loads[-1] += SQLITE_SECONDS  # the last shard starts with the SQLite pass
    for path in sorted(files, key=lambda f: (-durations.get(f, DEFAULT_SECONDS), f)):
        lightest = loads.index(min(loads))
        out[lightest].append(path)
        loads[lightest] += durations.get(path, DEFAULT_SECONDS)
    return [sorted(files) for files in out]


def commands(python: str, shards: list[list[str]]) -> list[list[str]]:
    """One command per shard, on servers of its own; the last runs the SQLite pass (make test-sqlite) first."""
    out = []
    for n, files in enumerate(shards):
        suite = f"{python} -m pytest {' '.join(files)}"
        if n == len(shards) - 1:
            suite = f'make --no-print-directory test-sqlite && echo "== on Postgres ==" && {suite}'
        out.append([python, "-m", "tests.support.servers", "run", "--", "sh", "-c", suite])
    return out


def shard_count() -> int:
    """PAL_TEST_SHARDS (default 2), or 1 when DATABASE_URL or CELERY_BROKER_URL name servers: shards would meet in
    their test database and broker."""
    if os.environ.get("DATABASE_URL") or os.environ.get("CELERY_BROKER_URL"):
        return 1
    return max(1, int(os.environ.get("PAL_TEST_SHARDS", "2")))


def main() -> int:
    python = sys.executable
    os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-insecure-key")
    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    shards = split(test_files(), durations, shard_count())
    logs = Path(tempfile.mkdtemp(prefix="pal-test-shards-"))
    procs = []
    for n, cmd in enumerate(commands(python, shards)):
        log = open(logs / f"shard-{n + 1}.log", "wb")
        guess = sum(durations.get(f, DEFAULT_SECONDS) for f in shards[n])
        print(f"shards: shard {n + 1} of {len(shards)}: {len(shards[n])} files, about {guess:.0f} s", flush=True)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((n + 1, proc, log))

    def stop(signum, frame):
        for _, proc, _ in procs:
            if proc.poll() is None:  # the shard's whole group: servers.run stops its servers, pytest its workers
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status, left, began = 0, list(procs), time.monotonic()
    while left:
        for item in list(left):
            n, proc, log = item
            if proc.poll() is None:
                continue
            left.remove(item)
            log.close()
            took = time.monotonic() - began
            print(f"\n===== shard {n} ended with {proc.returncode} after {took:.0f} s: its output =====", flush=True)
            sys.stdout.write((logs / f"shard-{n}.log").read_text(errors="replace"))
            sys.stdout.flush()
            status = status or proc.returncode
        time.sleep(0.5)
    print(f"shards: {'all passed' if status == 0 else 'FAILED'} in {time.monotonic() - began:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

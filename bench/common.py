"""What every side of the benchmark shares: where Postgres and Redis are, scratch databases,
worker subprocesses that cannot outlive us, and the statistics.

Settings (environment, all optional):

| variable | default | meaning |
| --- | --- | --- |
| `BENCH_PG_URL` | `postgresql://pal:pal@127.0.0.1:5432/pal` | a superuser connection; each side gets its own database |
| `BENCH_REDIS_URL` | `redis://127.0.0.1:6379` | each side gets its own Redis database number, flushed before use |
| `BENCH_DB_PREFIX` | `pal_bench` | the scratch databases are `<prefix>_ours`, `<prefix>_dbos`, `<prefix>_probe` |
| `BENCH_REDIS_DB_OURS`, `BENCH_REDIS_DB_CELERY` | `14`, `15` | the Redis database numbers of PAL Ops and bare Celery |
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://pal:pal@127.0.0.1:5432/pal")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")

# One scratch database and one Redis database number per side, so no side reads another's leftovers
# and nothing of the developer's own `pal` database or Redis db 0 is touched.
# The prefix and numbers can be moved, so two people can bench on one shared server at once.
_DB_PREFIX = os.environ.get("BENCH_DB_PREFIX", "pal_bench")
DBOS_DB = f"{_DB_PREFIX}_dbos"
OURS_DB = f"{_DB_PREFIX}_ours"
PROBE_DB = f"{_DB_PREFIX}_probe"
CELERY_REDIS_DB = int(os.environ.get("BENCH_REDIS_DB_CELERY", "15"))
OURS_REDIS_DB = int(os.environ.get("BENCH_REDIS_DB_OURS", "14"))

# Whole seconds we wait for a worker to come up before giving up on the measurement.
READY_TIMEOUT = 90.0


class Skipped(Exception):
    """A measurement that cannot run on this machine (a tool is missing): reported as skipped, with why."""


# --- Postgres -------------------------------------------------------------------------------------


def pg_url(dbname: str, *, scheme: str = "postgresql") -> str:
    """BENCH_PG_URL with its database replaced by `dbname`."""
    parts = urlsplit(PG_URL)
    return urlunsplit((scheme, parts.netloc, "/" + dbname, parts.query, ""))


def _pg_admin():
    import psycopg

    return psycopg.connect(pg_url(urlsplit(PG_URL).path.lstrip("/") or "postgres"), autocommit=True)


def pg_recreate(dbname: str) -> str:
    """Drop and create the scratch database `dbname`; returns its URL."""
    from psycopg import sql

    with _pg_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return pg_url(dbname)


def pg_drop(dbname: str) -> None:
    from psycopg import sql

    with _pg_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def pg_facts() -> dict:
    with _pg_admin() as conn:
        facts = {"server_version": conn.execute("SHOW server_version").fetchone()[0]}
        for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
            facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return facts


def pg_commit_ms(samples: int = 200) -> float:
    """Median milliseconds of one committed one-row INSERT over TCP, in a scratch database: the
    floor under any step made durable by a commit of its own."""
    import psycopg

    pg_recreate(PROBE_DB)
    try:
        with psycopg.connect(pg_url(PROBE_DB), autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (v int)")
            times = []
            for i in range(samples):
                started = time.perf_counter()
                conn.execute("INSERT INTO probe VALUES (%s)", (i,))
                times.append((time.perf_counter() - started) * 1000)
    finally:
        pg_drop(PROBE_DB)
    return median(times)


# --- Redis ----------------------------------------------------------------------------------------


def redis_url(db: int) -> str:
    return f"{REDIS_URL}/{db}"


def redis_flush(db: int) -> None:
    import redis

    client = redis.Redis.from_url(redis_url(db))
    try:
        client.flushdb()
    finally:
        client.close()


def redis_version() -> str:
    import redis

    client = redis.Redis.from_url(redis_url(0))
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


# --- Processes ------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def child_env(extra: dict | None = None) -> dict:
    """The environment for every process we start: the repo importable, our settings on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def log_dir() -> Path:
    """Where worker logs go: BENCH_LOG_DIR (set by the harness per run) or a fresh temporary folder."""
    path = os.environ.get("BENCH_LOG_DIR")
    if not path:
        path = tempfile.mkdtemp(prefix="pal-bench-")
        os.environ["BENCH_LOG_DIR"] = path
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


def spawn(
    cmd: list[str], *, name: str, env: dict | None = None, pipe_stdio: bool = False, cwd: Path | None = None
) -> subprocess.Popen:
    """Start a worker subprocess that dies with us (PR_SET_PDEATHSIG) and stays in our process group,
    so the harness can end the whole tree with one killpg. Its output goes to a log file unless
    `pipe_stdio`, for workers we talk to over stdin/stdout."""
    log = open(log_dir() / f"{name}.log", "ab")
    if pipe_stdio:
        stdin, stdout, stderr = subprocess.PIPE, subprocess.PIPE, log
    else:
        stdin, stdout, stderr = subprocess.DEVNULL, log, subprocess.STDOUT
    proc = subprocess.Popen(
        cmd,
        cwd=cwd or ROOT,  # another checkout's (scenario E's code before a change), else this one
        env=child_env(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=pipe_stdio,
        bufsize=1 if pipe_stdio else -1,
        preexec_fn=_die_with_parent,
    )
    log.close()  # the child holds its own copy
    return proc


def stop(procs: list[subprocess.Popen], *, grace: float = 10.0) -> None:
    """SIGTERM each process, wait up to `grace` seconds in all, then SIGKILL whatever is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=5)
    for proc in procs:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def celery_workers(
    app,
    app_path: str,
    count: int,
    *,
    env: dict | None = None,
    pool: str = "solo",
    queues: str | None = None,
    name: str = "w",
    cwd: Path | None = None,
):
    """Run `count` real `celery -A app_path worker` processes until the block ends (from `cwd`: another
    checkout's code, as scenario C's code before a change).

    `pool="solo"` makes each worker exactly one process that receives and runs its tasks, so
    "2 worker processes" means two processes, not a parent dispatching to children. Every side that
    runs on Celery uses the same flags, so the comparison is of engines, not of worker set-ups.
    Returns once every worker answers a ping (`app` is the Celery app object of `app_path`).
    """
    suffix = f"{os.getpid()}"
    host = socket.gethostname()
    nodes = [f"{name}{i}-{suffix}@{host}" for i in range(1, count + 1)]
    procs = []
    try:
        for node in nodes:
            cmd = [
                PYTHON,
                "-m",
                "celery",
                "-A",
                app_path,
                "worker",
                "--pool",
                pool,
                "-n",
                node,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
            ]
            if queues:
                cmd += ["-Q", queues]
            procs.append(spawn(cmd, name=node.split("@")[0], env=env, cwd=cwd))
        deadline = time.monotonic() + READY_TIMEOUT
        ready: set[str] = set()
        while not set(nodes) <= ready:
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"celery worker exited with {dead[0].returncode}; see {log_dir()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery workers not ready after {READY_TIMEOUT:.0f}s; see {log_dir()}")
            for reply in app.control.ping(destination=nodes, timeout=0.5) or []:
                ready.update(reply)
        yield nodes
    finally:
        stop(procs)


def django_setup(*, migrate: bool = True) -> None:
    """For bench.ours: configure Django from the environment the harness set (a fresh database
    `pal_bench_ours`, Redis db 14) and migrate it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def ours_env() -> dict:
    """The environment bench.ours runs in (and its Celery workers, via celery_workers(env=...))."""
    return {
        "DJANGO_SETTINGS_MODULE": "pal.settings",
        "DJANGO_SECRET_KEY": "bench-only-not-secret",
        "DATABASE_URL": pg_url(OURS_DB, scheme="postgres"),
        "CELERY_BROKER_URL": redis_url(OURS_REDIS_DB),
        "PAL_LOG_LEVEL": "WARNING",
    }


# --- Statistics -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: list[float]) -> float:
    return percentile(values, 50.0)


# --- The machine ----------------------------------------------------------------------------------


def machine_facts() -> dict:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"') + f" (kernel {platform.release()})"
    facts = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": mem_gib,
        "os": os_name,
        "python": platform.python_version(),
    }
    from importlib import metadata

    for dist in ("Django", "celery", "kombu", "redis", "psycopg", "dbos", "SQLAlchemy"):
        try:
            facts[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            facts[dist] = None
    try:
        facts["postgres"] = pg_facts()
        facts["postgres"]["commit_ms"] = round(pg_commit_ms(), 3)
    except Exception as exc:  # reported, not fatal: the report still says what it could
        facts["postgres"] = {"error": str(exc)}
    try:
        facts["redis_server"] = redis_version()
    except Exception as exc:
        facts["redis_server"] = f"error: {exc}"
    return facts

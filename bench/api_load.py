"""The REST API under load (issue 4's benchmark part; PAL Ops only): scenarios E and F.

E, `api_latency`: `POST /api/v1/runs`, `GET /api/v1/runs/{id}` and `POST /api/v1/runs/batch` (100 runs) driven by
`wrk` (a second process, in C) at a fixed number of connections against uvicorn serving `pal.asgi:application` on
Postgres, once through pal.web's sync path and once through Django's own ASGI handler (PAL_WEB_SYNC_PATH=0, how
every request was served before it); requests/s, latency median and p99, every non-2xx answer and socket error
counted, and uvicorn's CPU per answer against the view's own CPU through Django's test client in the bench process.

F, `idle_streams`: 500 event streams (`GET /api/v1/runs/{id}/events/stream`) held open by one httpx async client
against the same uvicorn, on runs parked on an approval so the streams stay open; uvicorn's memory (RSS), CPU and
threads while they idle, and whether every stream got every replayed event; then the runs are cancelled and
the streams must all close.

Both run in a child process (`bench.child`) with the fresh database `pal_bench_ours` and Redis db 14 (see
`common.ours_env()`): migrations, a superuser with an API token (`manage.py pal_token`) and the workflow are
made first, then uvicorn is started as a subprocess with the same environment, so every POST really sends its
Celery message to Redis (no worker takes it: the runs just stay queued, which does not touch POST/GET).

uvicorn runs ONE worker process (`--workers 1`): the machine has 2 cores, and they are shared by uvicorn, the
load generator and Postgres; with one process its RSS, CPU and threads are those of the whole server.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import common

UVICORN_WORKERS = 1
_TICKS = os.sysconf("SC_CLK_TCK")
WRK_SCRIPT = Path(__file__).resolve().parent / "wrk_runs.lua"


# --- the server process ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (uvicorn with --workers > 1 forks its workers)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by pid and its descendants (/proc/PID/stat utime + stime)."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from 1
    return total / _TICKS


def memory_threads(pid: int) -> tuple[float, int]:
    """(RSS in MiB, threads) of pid and its descendants, from /proc/PID/status (VmRSS, Threads)."""
    rss_kib, threads = 0, 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kib += int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
    return rss_kib / 1024, threads


@contextlib.contextmanager
def uvicorn_server(*, workers: int = UVICORN_WORKERS, env: dict | None = None, tree: Path | None = None):
    """uvicorn serving pal.asgi:application on the scratch database until the block ends; yields (base URL, Popen).

    The flags are docs/how-to/deploy.md's (`--http httptools --loop uvloop --no-access-log`) and no lifespan (Django has
    none)."""
    import httpx

    port = _free_port()
    cmd = [
        common.PYTHON,
        "-m",
        "uvicorn",
        "pal.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--http",
        "httptools",
        "--loop",
        "uvloop",
        "--lifespan",
        "off",
        "--no-access-log",
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",
        "5",
    ]
    env = {**common.ours_env(), **(env or {}), **({"PYTHONPATH": str(tree)} if tree else {})}
    proc = common.spawn(cmd, name="uvicorn", env=env, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + common.READY_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {proc.returncode}; see {common.log_dir()}/uvicorn.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn not ready after {common.READY_TIMEOUT:.0f}s; see {common.log_dir()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:  # database and broker reached
                    break
            time.sleep(0.2)
        yield base, proc
    finally:
        common.stop([proc])


def _prepare(workflow: dict) -> str:
    """Migrate the scratch database, make a superuser `bench` and its API token (as an operator would:
    `manage.py pal_token`, whose last line is the token), post the workflow. Returns the token."""
    common.django_setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from runs import services

    get_user_model().objects.create_superuser("bench", "bench@example.invalid", None)
    out = io.StringIO()
    call_command("pal_token", "bench", "--name", "bench", stdout=out)
    token = out.getvalue().strip().splitlines()[-1].strip()
    services.workflow_create(definition=workflow)
    return token


# --- E: POST /runs, GET /runs/{id} and POST /runs/batch under wrk ------------------------------------

ENDPOINTS = {"post": "POST /runs", "get": "GET /runs/{id}", "batch": "POST /runs/batch"}
# The server paths E compares in one run: pal.web's (one hop to a fixed pool of threads) and Django's own ASGI
# handler (a thread and a hop per middleware per request), which is what served every request before.
SERVER_PATHS = {
    "sync path": {},
    "Django ASGI handler": {"PAL_WEB_SYNC_PATH": "0"},
}
# BENCH_E_BEFORE_REF=<commit>: also serve the code of that commit (`git archive`, into a temporary folder; the
# repository is only read) on the same database, the "before" of a change in the same run.
BEFORE_REF = os.environ.get("BENCH_E_BEFORE_REF", "").strip()


def tree_at(ref: str) -> Path:
    """The code of commit `ref` in a temporary folder (`git archive`: the repository is only read)."""
    folder = Path(tempfile.mkdtemp(prefix="pal-bench-before-"))
    archive = subprocess.run(["git", "-C", str(common.ROOT), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def _wrk(
    base: str,
    mode: str,
    token: str,
    *,
    duration: float,
    connections: int,
    threads: int,
    ids_file: Path | None = None,
    batch_size: int = 100,
) -> dict:
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(WRK_SCRIPT),
        base,
        "--",
        mode,
        token,
    ]
    if mode == "get" and ids_file is not None:
        cmd.append(str(ids_file))
    if mode == "batch":
        cmd.append(str(batch_size))
    done = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True, timeout=duration + 60)
    with open(common.log_dir() / "wrk.log", "a") as log:
        log.write(f"$ wrk ... {mode} (exit {done.returncode})\n{done.stdout}{done.stderr}\n")
    for line in done.stdout.splitlines():
        if line.startswith("WRK_RESULT "):
            return json.loads(line[len("WRK_RESULT ") :])
    raise RuntimeError(f"wrk printed no result (exit {done.returncode}): {(done.stderr or done.stdout)[-500:]}")


def view_times(token: str, ids: list[str], *, requests: int, batch_size: int) -> dict:
    """The views' own time: the same three calls through Django's test client in this process (no server, no
    socket: the middleware, ninja, the queries), one at a time. Per endpoint: wall ms and this process's CPU ms
    per request (time.process_time), and the queries one request makes."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(headers={"Authorization": f"Bearer {token}", "Host": "127.0.0.1"})
    batch = json.dumps({"runs": [{"workflow": "bench-e", "input": {}} for _ in range(batch_size)]})

    def call(mode: str, i: int):
        if mode == "get":
            response = client.get(f"/api/v1/runs/{ids[i % len(ids)]}")
        elif mode == "post":
            response = client.post("/api/v1/runs", '{"workflow":"bench-e","input":{}}', content_type="application/json")
        else:
            response = client.post("/api/v1/runs/batch", batch, content_type="application/json")
        if response.status_code not in (200, 201):
            raise RuntimeError(f"{ENDPOINTS[mode]} through the test client answered {response.status_code}")

    out = {}
    for mode in ENDPOINTS:
        n = requests if mode != "batch" else max(5, requests // batch_size)
        for i in range(min(20, n)):  # warm-up: imports, the first connection, the token's last_used write
            call(mode, i)
        with CaptureQueriesContext(connection) as queries:
            call(mode, 0)
        counted = len(queries.captured_queries)  # now: the next request's start clears the log it slices
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            call(mode, i)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[mode] = {
            "endpoint": ENDPOINTS[mode],
            "requests": n,
            "wall_ms": wall / n * 1000,
            "cpu_ms": cpu / n * 1000,
            "queries": counted,
        }
        print(f"E view {out[mode]}", flush=True)
    return out


def _wait_idle(pid: int, *, window: float = 0.25, busy: float = 0.05, limit: float = 15.0) -> float:
    """Wait until the server has used less than `busy` of a core over `window` seconds (at most `limit` seconds);
    return how long that took. wrk stops sending at the end of a pass, but the server still works through what it
    has read (16 batches of 100 runs take it about half a second) and what it has to send: a pass that followed at
    once would measure its first requests queued behind them, and count the CPU as its own."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        before = cpu_seconds(pid)
        time.sleep(window)
        if cpu_seconds(pid) - before < busy * window:
            break
    return time.monotonic() - started


def _pass(base: str, proc, mode: str, token: str, *, ids_file: Path, batch_size: int, **opts) -> dict:
    settled = _wait_idle(proc.pid)
    cpu_before, started = cpu_seconds(proc.pid), time.monotonic()
    out = _wrk(base, mode, token, ids_file=ids_file, batch_size=batch_size, **opts)
    cpu_seconds_used = cpu_seconds(proc.pid) - cpu_before
    cpu = cpu_seconds_used / (time.monotonic() - started) * 100
    codes = {int(k): v for k, v in out["codes"].items()}
    seconds = out["duration_us"] / 1e6
    runs_per_request = batch_size if mode == "batch" else 1
    return {
        "endpoint": ENDPOINTS[mode],
        "requests": out["requests"],
        "seconds": round(seconds, 2),
        "rps": out["requests"] / seconds,
        "runs_per_s": out["requests"] * runs_per_request / seconds if mode != "get" else None,
        "p50_ms": out["p50_us"] / 1000,
        "p90_ms": out["p90_us"] / 1000,
        "p99_ms": out["p99_us"] / 1000,
        "max_ms": out["max_us"] / 1000,
        "codes": {str(k): v for k, v in sorted(codes.items())},
        "non_2xx": sum(v for k, v in codes.items() if not 200 <= k < 300),
        "socket_errors": sum(out["socket_errors"].values()),
        "socket_error_kinds": out["socket_errors"],
        "server_cpu_percent": round(cpu, 1),
        # uvicorn's CPU per answer: what the server path and the view cost together, to set against the view's own.
        "server_cpu_ms": cpu_seconds_used * 1000 / out["requests"] if out["requests"] else None,
        "settled_s": round(settled, 2),  # how long the server took to go idle after the pass before
    }


def api_latency(
    duration: float,
    connections: int,
    threads: int,
    repeats: int,
    get_runs: int = 200,
    batch_size: int = 100,
    view_requests: int = 300,
) -> dict:
    """E: the views' own time through Django's test client in this process (view_times), then for each server
    path (SERVER_PATHS: pal.web's, Django's ASGI handler as before it, and with BENCH_E_BEFORE_REF the code of
    that commit, served from a `git archive` of it on the same database) a uvicorn and, per repeat, `duration`
    seconds each of POST /api/v1/runs, GET /api/v1/runs/{id} (round-robin over `get_runs` runs) and POST
    /api/v1/runs/batch of `batch_size` runs, each by `wrk -t{threads} -c{connections}` (closed loop: each
    connection sends its next request when the answer to the last one has come). 2-second passes of each first
    warm the server up and are not counted. Each pass starts once the server has gone idle after the one before
    (_wait_idle). Per pass: requests/s (and runs/s), latency p50/p90/p99/max, the answers' status codes, socket
    errors, and uvicorn's CPU over the pass (/proc), in % and in ms per answer."""
    if shutil.which("wrk") is None:
        raise common.Skipped("wrk not installed (Debian package wrk; `make bench` installs it when run as root)")
    token = _prepare({"name": "bench-e", "steps": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}]})
    from django.conf import settings
    from django.db import connections as db_connections

    from runs import services
    from runs.models import Run

    # The runs the GETs read: queued runs made as POST makes them (the service the API calls).
    ids = [str(services.run_create(workflow_name="bench-e", created_by="bench")[0].id) for _ in range(get_runs)]
    ids_file = Path(tempfile.mkdtemp(prefix="pal-bench-e-")) / "run_ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    views = view_times(token, ids, requests=view_requests, batch_size=batch_size)
    db_connections.close_all()
    passes = []
    opts = {"connections": connections, "threads": threads, "ids_file": ids_file, "batch_size": batch_size}
    servers = [(name, env, None) for name, env in SERVER_PATHS.items()]
    if BEFORE_REF:
        servers.append((f"code at {BEFORE_REF} (before)", {}, tree_at(BEFORE_REF)))
    for server, env, tree in servers:
        with uvicorn_server(env=env, tree=tree) as (base, proc):
            for mode in ENDPOINTS:  # warm-up, not counted
                _wrk(base, mode, token, duration=2, **opts)
            for number in range(1, repeats + 1):
                for mode in ENDPOINTS:
                    row = _pass(base, proc, mode, token, duration=duration, **opts)
                    view = views[mode]
                    same_code = row["server_cpu_ms"] and tree is None
                    row.update(
                        server=server,
                        repeat=number,
                        view_cpu_ms=view["cpu_ms"],
                        # How much the server path adds to the view's own CPU (0.3: 30 % more); the views measured
                        # are this code's, so not for the code before.
                        overhead=row["server_cpu_ms"] / view["cpu_ms"] - 1 if same_code else None,
                    )
                    passes.append(row)
                    print(f"E {passes[-1]}", flush=True)
    runs_made = Run.objects.count()
    db_connections.close_all()
    details = {
        "workers": UVICORN_WORKERS,
        "web_threads": settings.PAL_WEB_THREADS,
        "before_ref": BEFORE_REF or None,
        "connections": connections,
        "threads": threads,
        "duration": duration,
        "get_runs": get_runs,
        "batch_size": batch_size,
        "runs_made": runs_made,
        "views": views,
        "passes": passes,
    }
    return {"values": [p["rps"] for p in passes], "details": details}


# --- F: 500 event streams held open ---------------------------------------------------------------


def _stuck_runs(count: int) -> list[str]:
    """`count` runs of bench-f walked in this process (as bench.ours does for A) until each parks on its
    approval: status waiting, no lease, nothing more to journal until someone decides or cancels."""
    from bench.ours import _drive_inline
    from runs import services
    from runs.models import Run

    ids = []
    for _ in range(count):
        run, _ = services.run_create(workflow_name="bench-f")
        _drive_inline(run)
        ids.append(str(run.id))
    waiting = Run.objects.filter(id__in=ids, status="waiting").count()
    if waiting != count:
        raise RuntimeError(f"{waiting} of {count} runs are waiting on their approval")
    return ids


class _Db:
    """This process's database work during F, on ONE thread whose connections are opened before the streams
    (so the measurement never waits for a free Postgres connection slot): a Django connection to the scratch
    database for the cancels, and a psycopg connection to the admin database to count connections."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-db")
        self.admin, self.max_connections = None, None
        self.thread.submit(self._open).result()

    def _open(self):
        from django.db import connection

        connection.ensure_connection()
        self.admin = common._pg_admin()
        self.max_connections = int(self.admin.execute("SHOW max_connections").fetchone()[0])

    def _count(self) -> int:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s"
        from django.db import connection

        mine = connection.connection.info.backend_pid
        return self.admin.execute(sql, (common.OURS_DB, mine)).fetchone()[0]

    def _cancel(self, ids: list[str]) -> int:
        from runs import services

        done = 0
        for run_id in ids:
            services.run_cancel(run_id=run_id, by="bench", reason="scenario F measured")
            done += 1
        return done

    async def scratch_connections(self) -> int | None:
        """Connections to the scratch database now, but this process's own: uvicorn's."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.thread, self._count)
        except Exception as exc:
            print(f"F: could not count connections: {exc}", flush=True)
            return None

    async def cancel(self, ids: list[str]) -> int:
        return await asyncio.get_running_loop().run_in_executor(self.thread, self._cancel, ids)

    def close(self):
        from django.db import connection

        def _close():
            connection.close()
            if self.admin is not None:
                self.admin.close()

        with contextlib.suppress(Exception):
            self.thread.submit(_close).result()
        self.thread.shutdown()


class _Stream:
    __slots__ = ("closed_at", "error", "events", "expected", "kinds", "replayed", "replayed_at", "run_id", "status")

    def __init__(self, run_id: str, expected: int):
        self.run_id, self.expected = run_id, expected
        self.status, self.events, self.kinds, self.error = None, 0, [], None
        self.replayed, self.replayed_at, self.closed_at = asyncio.Event(), None, None


async def _follow(client, stream: _Stream) -> None:
    try:
        async with client.stream("GET", f"/api/v1/runs/{stream.run_id}/events/stream") as response:
            stream.status = response.status_code
            if response.status_code != 200:
                stream.error = f"HTTP {response.status_code}"
                return
            async for line in response.aiter_lines():
                if line.startswith("data:"):  # one data line per event (compact JSON), with or without `event:`
                    stream.events += 1
                    stream.kinds.append(json.loads(line[5:]).get("kind"))
                    if stream.events >= stream.expected and not stream.replayed.is_set():
                        stream.replayed_at = time.monotonic()
                        stream.replayed.set()
            stream.closed_at = time.monotonic()
    except Exception as exc:  # counted and reported, never fatal for the others
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        stream.replayed.set()


async def _hold(base: str, token: str, expected: dict[str, int], pid: int, idle_seconds: float) -> dict:
    db = _Db()
    try:
        return await _hold_with(db, base, token, expected, pid, idle_seconds)
    finally:
        db.close()


async def _hold_with(db: _Db, base: str, token: str, expected: dict[str, int], pid: int, idle_seconds: float) -> dict:
    import httpx

    n = len(expected)
    limits = httpx.Limits(max_connections=n + 50, max_keepalive_connections=n + 50)
    timeout = httpx.Timeout(30.0, read=None)  # an idle stream only sends a keep-alive every 15 s
    async with httpx.AsyncClient(
        base_url=base, limits=limits, timeout=timeout, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        rss_before, threads_before = memory_threads(pid)
        connections_before = await db.scratch_connections()
        cpu_before = cpu_seconds(pid)
        streams = [_Stream(run_id, count) for run_id, count in expected.items()]
        opened = time.monotonic()
        tasks = [asyncio.create_task(_follow(client, s)) for s in streams]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.replayed.wait() for s in streams)), timeout=120)
        except TimeoutError:
            pass  # reported below: the streams that did not get their replay
        open_seconds = time.monotonic() - opened
        cpu_open = cpu_seconds(pid) - cpu_before

        # The idle window: every stream open, nothing new to send.
        samples = []
        cpu_start, idle_start = cpu_seconds(pid), time.monotonic()
        cpu_last, at_last = cpu_start, idle_start
        while time.monotonic() - idle_start < idle_seconds:
            await asyncio.sleep(min(1.0, max(0.0, idle_seconds - (time.monotonic() - idle_start))))
            rss, threads = memory_threads(pid)
            cpu_now, at_now = cpu_seconds(pid), time.monotonic()
            samples.append(
                {
                    "rss_mib": rss,
                    "threads": threads,
                    "cpu_percent": round((cpu_now - cpu_last) / (at_now - at_last) * 100, 1),
                    "pg_connections": await db.scratch_connections(),
                }
            )
            cpu_last, at_last = cpu_now, time.monotonic()
        idle_wall = time.monotonic() - idle_start
        cpu_idle = cpu_seconds(pid) - cpu_start
        events_before_cancel = sum(s.events for s in streams)
        open_at_end = sum(1 for s in streams if s.status == 200 and s.closed_at is None and s.error is None)
        full_replay = sum(1 for s in streams if s.replayed_at is not None)

        # Cancel the runs: each stream gets run_cancelled and the server closes it.
        cancelled = time.monotonic()
        to_cancel = [s.run_id for s in streams]
        cancelled_runs = await db.cancel(to_cancel)
        _, pending = await asyncio.wait(tasks, timeout=90)
        for task in pending:
            task.cancel()
        closes = [s.closed_at for s in streams if s.closed_at is not None and s.closed_at >= cancelled]
    rss_idle = [x["rss_mib"] for x in samples]
    errors = Counter(s.error for s in streams if s.error)
    return {
        "streams": n,
        "answered_200": sum(1 for s in streams if s.status == 200),
        "answers": {str(k): v for k, v in sorted(Counter(s.status for s in streams if s.status).items())},
        "ended_before_cancel": sum(
            1 for s in streams if s.status == 200 and s.closed_at is not None and s.closed_at < cancelled
        ),
        "full_replay": full_replay,
        "events_expected": sum(expected.values()),
        "events_replayed": events_before_cancel,
        "open_at_idle_end": open_at_end,
        "open_seconds": round(open_seconds, 2),
        "cpu_seconds_open": round(cpu_open, 2),
        "rss_before_mib": round(rss_before, 1),
        "rss_idle_mib": round(max(rss_idle), 1) if rss_idle else None,
        # Per stream only when every stream was open through the window; else the growth is not theirs alone.
        "rss_per_stream_kib": round((max(rss_idle) - rss_before) * 1024 / n, 1)
        if rss_idle and open_at_end == n
        else None,
        "threads_before": threads_before,
        "threads_idle": max(x["threads"] for x in samples) if samples else None,
        "pg_connections_before": connections_before,
        "pg_connections_idle_max": max(
            (x["pg_connections"] for x in samples if x["pg_connections"] is not None), default=None
        ),
        "pg_max_connections": db.max_connections,
        "cancelled_runs": cancelled_runs,
        "idle_seconds": round(idle_wall, 1),
        "cpu_percent_idle": round(cpu_idle / idle_wall * 100, 2),
        "closed_after_cancel": len(closes),
        "got_run_cancelled": sum(1 for s in streams if "run_cancelled" in s.kinds),
        "close_seconds": round(max(closes) - cancelled, 2) if closes else None,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(5)),
        "samples": samples,
    }


def idle_streams(streams: int, idle_seconds: float) -> dict:
    """F: `streams` runs parked on an approval, one SSE stream each held open by an httpx AsyncClient (one
    connection per stream) against uvicorn; uvicorn's RSS and threads (/proc/PID/status) before the streams and
    each second of an `idle_seconds` window with all of them open, its CPU over that window (/proc/PID/stat),
    the events each stream got against the run's journal, then the time from cancelling the runs to the last
    stream closed."""
    token = _prepare(
        {
            "name": "bench-f",
            "steps": [
                {"id": "first", "kind": "tool_call", "tool": "echo", "args": {}},
                {"id": "go", "kind": "approval", "prompt": "go on?"},
            ],
        }
    )
    from django.db import connections as db_connections
    from django.db.models import Count

    from bench.ours import _drive_inline
    from journal.models import JournalEvent
    from runs import services

    services.workflow_create(
        definition={"name": "bench-f-warm", "steps": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}]}
    )
    warm, _ = services.run_create(workflow_name="bench-f-warm")
    _drive_inline(warm)
    ids = _stuck_runs(streams)
    rows = JournalEvent.objects.filter(run_id__in=ids).order_by().values("run_id").annotate(n=Count("seq"))
    counts = {str(row["run_id"]): row["n"] for row in rows}
    expected = {run_id: counts.get(run_id, 0) for run_id in ids}  # what each stream must replay
    if not all(expected.values()):
        raise RuntimeError("a parked run has no journal")
    db_connections.close_all()
    with uvicorn_server() as (base, proc):
        import httpx

        # Warm-up, not measured: a finished run's stream (replays and closes) and a few reads.
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            for _ in range(3):
                client.get(f"/api/v1/runs/{warm.id}/events/stream").raise_for_status()
                client.get(f"/api/v1/runs/{ids[0]}").raise_for_status()
        time.sleep(1.0)
        details = asyncio.run(_hold(base, token, expected, proc.pid, idle_seconds))
    details["workers"] = UVICORN_WORKERS
    print(f"F {json.dumps({k: v for k, v in details.items() if k != 'samples'})}", flush=True)
    print(f"F idle samples {json.dumps(details['samples'])}", flush=True)
    if details["rss_idle_mib"] is None:
        raise RuntimeError("no sample of the idle window")
    return {"values": [details["rss_idle_mib"]], "details": details}

"""`python -m bench.profile_api {path|server} [get|post] [...]`: where scenario E's CPU goes (issue 29 section 3).

Both make E's scratch database, token and 200 runs first (bench.api_load), then:

- path: what one of pal.web's threads does for a request (`SyncPathHandler.respond`: the middleware, ninja, the
  view, its queries), called `-n` times on this one thread, once plain (CPU ms per request, time.process_time) and
  once under cProfile, whose top functions are printed. One thread, so cProfile's figures are sound; what it leaves
  out is uvicorn, the hop to the thread and the threads' turns at the GIL.
- server: uvicorn as E runs it, under `python -X perf`, sampled by `perf record` (Linux perf) while wrk drives it
  at 16 connections; prints each thread's share of the samples and the leaf functions (the GIL's futex and the
  scheduler among them). Python frames are named in the samples only as far as perf can unwind them.

Needs BENCH_PG_URL and BENCH_REDIS_URL, e.g. `python -m tests.support.servers run -- sh -c 'BENCH_PG_URL=$DATABASE_URL
BENCH_REDIS_URL=${CELERY_BROKER_URL%/*} python -m bench.profile_api path get'`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import common

FLOW = {"name": "bench-e", "steps": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}]}
CREATE = b'{"workflow":"bench-e","input":{}}'


def _prepare() -> tuple[str, list[str]]:
    """E's scratch database, token and runs (in this process, then its connections closed); (token, run ids)."""
    from bench import api_load

    common.pg_recreate(common.OURS_DB)
    common.redis_flush(common.OURS_REDIS_DB)
    os.environ.update(common.ours_env())
    token = api_load._prepare(FLOW)
    from django.db import connections

    from runs import services

    ids = [str(services.run_create(workflow_name="bench-e", created_by="bench")[0].id) for _ in range(200)]
    connections.close_all()
    return token, ids


def path(mode: str, requests: int, top: int) -> None:
    """The request as a web thread handles it, in a child process set up as uvicorn's (pal.asgi)."""
    token, ids = _prepare()
    spec = json.dumps({"token": token, "ids": ids, "mode": mode, "requests": requests, "top": top})
    subprocess.run([common.PYTHON, "-m", "bench.profile_api", "--child", spec], env=common.child_env(), check=True)


def _path_child(spec: dict) -> None:
    from pal.asgi import application
    from pal.db_pool import web_thread_start

    web_thread_start()  # as pal.web's threads: the connection is kept across requests
    handler, token, ids = application.handler, spec["token"], spec["ids"]

    def one(i: int) -> None:
        target, method, body = (f"/api/v1/runs/{ids[i % len(ids)]}", "GET", b"")
        if spec["mode"] == "post":
            target, method, body = "/api/v1/runs", "POST", CREATE
        headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode())]
        headers += [(b"accept", b"application/json")]
        if body:
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": target,
            "raw_path": target.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }
        resolved = application.resolve(scope)
        status, _, parts = handler.respond(scope, io.BytesIO(body), resolved if resolved[1] else None)
        if status not in (200, 201):
            raise RuntimeError(f"{method} {target} answered {status}: {b''.join(parts)[:300]!r}")

    n = spec["requests"]
    for i in range(200):
        one(i)  # warm-up: imports, the connection, the token's last_used stamp
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        one(i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{spec['mode']}: {cpu / n * 1000:.3f} CPU ms and {wall / n * 1000:.3f} ms per request, no profiler")
    profile = cProfile.Profile()
    profile.enable()
    for i in range(n):
        one(i)
    profile.disable()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(spec["top"])
    stats.sort_stats("cumulative").print_stats(spec["top"])


def server(mode: str, seconds: float, top: int) -> None:
    """uvicorn under perf record while wrk drives it."""
    if shutil.which("perf") is None:
        raise SystemExit("perf (Linux perf) is not installed")
    from bench import api_load

    token, ids = _prepare()
    folder = Path(tempfile.mkdtemp(prefix="pal-profile-"))
    (folder / "ids.txt").write_text("\n".join(ids) + "\n")
    spawn = common.spawn

    def spawn_with_perf_maps(cmd, **kwargs):  # Python's own functions in perf's samples (perf map files)
        return spawn([cmd[0], "-X", "perf", *cmd[1:]] if "uvicorn" in cmd else cmd, **kwargs)

    common.spawn = spawn_with_perf_maps
    opts = {"connections": 16, "threads": 2, "ids_file": folder / "ids.txt", "batch_size": 100}
    data = folder / "perf.data"
    with api_load.uvicorn_server() as (base, proc):
        api_load._wrk(base, mode, token, duration=3, **opts)  # warm-up
        record = subprocess.Popen(
            ["perf", "record", "-F", "997", "-g", "-p", str(proc.pid), "-o", str(data), "--", "sleep", str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        row = api_load._pass(base, proc, mode, token, duration=seconds + 2, **opts)
        record.wait()
    print(
        f"{mode}: {row['rps']:.0f} requests/s, p99 {row['p99_ms']:.1f} ms, {row['server_cpu_ms']:.3f} CPU ms per answer"
    )
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "tid,ip,sym"], capture_output=True, text=True, check=True
    )
    _perf_summary(script.stdout, top)


def _perf_summary(text: str, top: int) -> None:
    samples: list[tuple[int, list[str]]] = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines()]
        if lines and lines[0].split()[0].isdigit():
            frames = [line.split(None, 1)[1] if " " in line else line for line in lines[1:]]
            samples.append((int(lines[0].split()[0]), frames))
    if not samples:
        print("perf recorded no sample")
        return
    loop = min(tid for tid, _ in samples)  # the process's first thread runs the event loop
    threads = Counter("event loop" if tid == loop else "web and other threads" for tid, _ in samples)
    print(f"{len(samples)} samples: " + ", ".join(f"{name} {n / len(samples):.0%}" for name, n in threads.items()))

    def leaf(frames: list[str]) -> str:
        calls = [f for f in frames if f.startswith(("__x64_sys_", "__sys_"))]
        if frames and ("schedule" in frames[0] or "finish_task_switch" in frames[0]):
            return "kernel: the scheduler (a thread switch)"
        return f"kernel: {calls[0]}" if calls else (frames[0].split("+")[0] if frames else "?")

    for name, n in Counter(leaf(frames) for _, frames in samples).most_common(top):
        print(f"{n / len(samples):6.1%}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_api", description=__doc__.splitlines()[0])
    parser.add_argument("how", nargs="?", choices=("path", "server"), default="path")
    parser.add_argument("mode", nargs="?", choices=("get", "post"), default="get")
    parser.add_argument("-n", "--requests", type=int, default=3000, help="path: requests timed (and profiled)")
    parser.add_argument("--seconds", type=float, default=8.0, help="server: seconds sampled")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _path_child(json.loads(args.child))
    elif args.how == "path":
        path(args.mode, args.requests, args.top)
    else:
        server(args.mode, args.seconds, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())

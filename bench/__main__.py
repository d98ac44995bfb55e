"""`python -m bench [--quick]`: run the benchmarks and write docs/PERFORMANCE.md.

Every measurement runs in a child process (`bench.child`) in its own process group, with a time
limit; on the limit, Ctrl-C or SIGTERM the whole group is killed, workers included. A side that is
not written yet (NotImplementedError) is reported as "not measured yet"; a side that fails is
reported with its error, and the other sides still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common, real_path, report

# The code before issue 29's changes, served beside this code in a full run (E: the read path; C: the idle fleet),
# unless the variable is set (empty: no "before"); a clone without that history skips it.
BEFORE_REFS = {"BENCH_E_BEFORE_REF": "a63e0f0", "BENCH_C_BEFORE_REF": "dc9cca4^"}
SIDES = ("ours", "dbos", "celery")
SCENARIOS = ("A", "B", "C", "D", "E", "F", "G", "H", "J")
# Scenarios run in rounds (see plan()).
ROUNDS = ("A", "B", "G")


def plan(quick: bool) -> dict:
    """The sizes and repeats of every scenario; --quick keeps the sizes and cuts the repeats.

    A, B and G run in `rounds`, each round one job per side in turn, so a burst of load from something
    else on the machine falls on every side rather than on one; `repeats` is per round.
    """
    return {
        "rounds": 1 if quick else 2,
        "A": {"steps": 1000, "repeats": 2 if quick else 5},
        # A through one real worker with the default slice (issue 29 section 1): runs of each size a round, and the
        # journal sizes at which what a hand-off reads is timed (the 10,000-step run's journal: about 20,000 rows).
        "A worker": {
            "sizes": {1000: 2 if quick else 3, 10_000: 1},
            "replay_rows": [1000, 5000, 10_000, 20_000],
        },
        "B": {"runs": 200, "steps": 10, "workers": 2, "repeats": 1 if quick else 2},
        # C's idle fleet: a beat and 2 workers with no run, the look at lease expiry on and then off, each for
        # `idle_seconds` after `idle_settle` seconds of start-up.
        "C": {
            "repeats": 1 if quick else 3,
            "recovery_interval": 5,
            "lease_ttl": 5,
            "idle_seconds": 60,
            "idle_settle": 10,
            "idle_interval": 2,  # PAL_RECOVERY_INTERVAL of the idle fleet: a sweep every 2 s, as issue 29 measured
            "workers": 2,
        },
        "D": {"finished": 100_000 if quick else 1_000_000, "stuck": 1000, "repeats": 1 if quick else 3},
        # E: seconds per wrk pass per endpoint (POST /runs, GET /runs/{id}, POST /runs/batch) and server path.
        # F: streams held open, and the idle window in seconds: one
        # keep-alive period (PAL_STREAM_KEEPALIVE, 15 s), so each open stream sends one keep-alive in it.
        "E": {"duration": 12, "connections": 16, "threads": 2, "repeats": 1 if quick else 2},
        "F": {"streams": 500, "idle_seconds": 15},
        # G: one fan-out of no-op items against the same steps as a list, DBOS and a Celery group (issue 12).
        # H: independent sleep steps in one run; the run's wall time over one sleep.
        "G": {"items": 1000, "max_concurrency": 50, "workers": 2, "repeats": 1 if quick else 2},
        "H": {"steps": 8, "seconds": 1, "workers": 2, "repeats": 2 if quick else 3},
        # J: every page and list with `small` finished runs and with `large`, `requests` each after a warm-up.
        "J": {"small": 1000, "large": 1_000_000, "requests": 5 if quick else 20, "warmup": 3},
    }


def jobs(p: dict) -> list[dict]:
    """One job per (scenario, side, variant) and round; `timeout` bounds it, start-up included."""
    a, b, c, d, e, f, g, h, j = (p[s] for s in SCENARIOS)
    worker = p["A worker"]
    out = [
        # A: per-step overhead, one run of 1,000 no-op steps.
        {
            "scenario": "A",
            "side": "ours",
            "variant": "run_drive",
            "module": "bench.ours",
            "func": "per_step_overhead",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"]},
            "timeout": 300,
        },
        {
            "scenario": "A",
            "side": "ours",
            "variant": "run_drive, a commit per step",
            "module": "bench.ours",
            "func": "per_step_overhead",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"], "commit_each": True},
            "timeout": 300,
        },
        {
            "scenario": "A",
            "side": "ours",
            "variant": "python workflow",
            "module": "bench.ours",
            "func": "per_step_overhead_python",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"]},
            "timeout": 300,
        },
        {
            "scenario": "A",
            "side": "ours",
            "variant": "python workflow, pure steps",
            "module": "bench.ours",
            "func": "per_step_overhead_python",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"], "pure": True},
            "timeout": 300,
        },
        # A through a real worker, default settings (bench/real_path.py): one job per size, the largest with the
        # hand-off's reads timed; each well under 3 minutes here (a 10,000-step run walks in 10 to 20 s).
        *(
            {
                "scenario": "A",
                "side": "ours",
                "variant": real_path.variant(steps),
                "module": "bench.real_path",
                "func": "through_a_worker",
                "kwargs": {
                    "steps": steps,
                    "repeats": repeats,
                    "replay_rows": worker["replay_rows"] if steps == max(worker["sizes"]) else None,
                },
                "timeout": 180,
            }
            for steps, repeats in worker["sizes"].items()
        ),
        # A commit per step (a step with an effect's path), at both sizes: at 10,000 steps such a run outlasts a
        # slice, so its hand-offs are measured even when the pure run ends within its first slice.
        *(
            {
                "scenario": "A",
                "side": "ours",
                "variant": real_path.variant(steps, commit_each=True),
                "module": "bench.real_path",
                "func": "through_a_worker",
                "kwargs": {"steps": steps, "repeats": repeats, "commit_each": True},
                "timeout": 180,
            }
            for steps, repeats in worker["sizes"].items()
        ),
        {
            "scenario": "A",
            "side": "dbos",
            "variant": "workflow",
            "module": "bench.peers_dbos",
            "func": "per_step_overhead",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"]},
            "timeout": 300,
        },
        {
            "scenario": "A",
            "side": "celery",
            "variant": "chain",
            "module": "bench.peers_celery",
            "func": "per_step_overhead",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"], "mode": "chain"},
            "timeout": 180,
        },
        {
            "scenario": "A",
            "side": "celery",
            "variant": "roundtrip",
            "module": "bench.peers_celery",
            "func": "per_step_overhead",
            "kwargs": {"steps": a["steps"], "repeats": a["repeats"], "mode": "roundtrip"},
            "timeout": 180,
        },
        # B: throughput, 200 runs of 10 no-op steps over 2 worker processes.
        {
            "scenario": "B",
            "side": "ours",
            "variant": "celery workers",
            "module": "bench.ours",
            "func": "throughput",
            "calls": b["repeats"],
            "kwargs": {"runs": b["runs"], "steps": b["steps"], "workers": b["workers"]},
            "timeout": 300,
        },
        {
            "scenario": "B",
            "side": "dbos",
            "variant": "queue",
            "module": "bench.peers_dbos",
            "func": "throughput",
            "kwargs": {
                "runs": b["runs"],
                "steps": b["steps"],
                "workers": b["workers"],
                "repeats": b["repeats"],
                "mode": "queue",
            },
            "timeout": 240,
        },
        {
            "scenario": "B",
            "side": "dbos",
            "variant": "direct",
            "module": "bench.peers_dbos",
            "func": "throughput",
            "kwargs": {
                "runs": b["runs"],
                "steps": b["steps"],
                "workers": b["workers"],
                "repeats": b["repeats"],
                "mode": "direct",
            },
            "timeout": 240,
        },
        {
            "scenario": "B",
            "side": "celery",
            "variant": "chains",
            "module": "bench.peers_celery",
            "func": "throughput",
            "kwargs": {"runs": b["runs"], "steps": b["steps"], "workers": b["workers"], "repeats": b["repeats"]},
            "timeout": 180,
        },
        # C and D: PAL Ops only.
        {
            "scenario": "C",
            "side": "ours",
            "variant": "kill -9",
            "module": "bench.ours",
            "func": "crash_to_resume",
            "kwargs": {"repeats": c["repeats"]},
            "env": {"PAL_RECOVERY_INTERVAL": c["recovery_interval"], "PAL_LEASE_TTL": c["lease_ttl"]},
            "timeout": 300,
        },
        # C, idle load (issue 15 section 2): the database's transactions a minute with nothing to recover.
        {
            "scenario": "C",
            "side": "ours",
            "variant": "idle fleet",
            "module": "bench.ours",
            "func": "idle_fleet_queries",
            "kwargs": {"seconds": c["idle_seconds"], "workers": c["workers"], "settle": c["idle_settle"]},
            "env": {"PAL_RECOVERY_INTERVAL": c["idle_interval"], "PAL_LEASE_TTL": c["lease_ttl"]},
            "timeout": 120 + 2 * (c["idle_seconds"] + c["idle_settle"] + 30),
        },
        {
            "scenario": "D",
            "side": "ours",
            "variant": "sweep",
            "module": "bench.ours",
            "func": "sweep_time",
            "kwargs": {"finished": d["finished"], "stuck": d["stuck"], "repeats": d["repeats"]},
            "timeout": 900,
        },
        # E and F: the REST API under uvicorn (bench/api_load.py), PAL Ops only.
        {
            "scenario": "E",
            "side": "ours",
            "variant": "wrk",
            "module": "bench.api_load",
            "func": "api_latency",
            "kwargs": {
                "duration": e["duration"],
                "connections": e["connections"],
                "threads": e["threads"],
                "repeats": e["repeats"],
            },
            # Up to three servers (two paths, and the code before with BENCH_E_BEFORE_REF) x three endpoints per
            # repeat, their warm-ups, and the views' own time first.
            "timeout": 240 + 3 * 3 * e["duration"] * e["repeats"] + 60,
        },
        {
            "scenario": "F",
            "side": "ours",
            "variant": "httpx streams",
            "module": "bench.api_load",
            "func": "idle_streams",
            "kwargs": {"streams": f["streams"], "idle_seconds": f["idle_seconds"]},
            "timeout": 420,
        },
        *fan_out_jobs(g),
        # H: 8 independent `sleep 1` tool steps in one run, on 2 worker processes.
        {
            "scenario": "H",
            "side": "ours",
            "variant": "needs []",
            "module": "bench.graphs",
            "func": "parallel_sleeps",
            "kwargs": {"steps": h["steps"], "seconds": h["seconds"], "workers": h["workers"], "repeats": h["repeats"]},
            "timeout": 180 + 10 * h["steps"] * h["seconds"] * h["repeats"],
        },
        # J: flat at scale (bench/flat.py): the fill is most of it (about 2 to 5 minutes for a million runs here).
        {
            "scenario": "J",
            "side": "ours",
            "variant": "test client",
            "module": "bench.flat",
            "func": "flat_at_scale",
            "kwargs": j,
            "timeout": 1200,
        },
    ]
    rounds = []
    for scenario in ROUNDS:
        for i in range(p["rounds"]):
            rounds += [{**job, "round": i + 1} for job in out if job["scenario"] == scenario]
    return rounds + [{**job, "round": 1} for job in out if job["scenario"] not in ROUNDS]


def fan_out_jobs(g: dict) -> list[dict]:
    """G: 1,000 no-op items over 2 worker processes, five ways; the first row is the one the others are compared to."""
    n, workers, repeats = g["items"], g["workers"], g["repeats"]
    ours = {"items": n, "max_concurrency": g["max_concurrency"], "workers": workers, "repeats": repeats}
    dbos = {"runs": n, "steps": 1, "workers": workers, "repeats": repeats}
    return [
        {
            "scenario": "G",
            "side": "ours",
            "variant": "for_each",
            "module": "bench.graphs",
            "func": "fan_out",
            "kwargs": ours,
            "timeout": 420,
        },
        {
            "scenario": "G",
            "side": "ours",
            "variant": "plain list",
            "module": "bench.graphs",
            "func": "fan_out",
            "kwargs": {**ours, "shape": "list"},
            "timeout": 420,
        },
        {
            "scenario": "G",
            "side": "dbos",
            "variant": "queue",
            "module": "bench.peers_dbos",
            "func": "throughput",
            "kwargs": {**dbos, "mode": "queue", "global_concurrency": g["max_concurrency"]},
            "timeout": 300,
        },
        {
            "scenario": "G",
            "side": "dbos",
            "variant": "direct",
            "module": "bench.peers_dbos",
            "func": "throughput",
            "kwargs": {**dbos, "mode": "direct"},
            "timeout": 300,
        },
        {
            "scenario": "G",
            "side": "celery",
            "variant": "group",
            "module": "bench.peers_celery",
            "func": "group_fan_out",
            "kwargs": {"items": n, "workers": workers, "repeats": repeats},
            "timeout": 180,
        },
    ]


def merge(results: list[dict]) -> list[dict]:
    """One row per (scenario, side, variant): the rounds' figures together; any failed round fails the row."""
    rows: dict[tuple, dict] = {}
    for r in results:
        key = (r["scenario"], r["side"], r["variant"])
        if key not in rows:
            rows[key] = {
                **r,
                "values": list(r.get("values", [])),
                "details": list(r.get("details", [])),
                "loadavg": [r["loadavg"]],
            }
            continue
        row = rows[key]
        row["wall_seconds"] = round(row["wall_seconds"] + r["wall_seconds"], 1)
        row["loadavg"].append(r["loadavg"])
        if row["status"] == "ok" and r["status"] != "ok":
            row.update({k: r[k] for k in ("status", "message", "log") if k in r})
        row["values"] += r.get("values", [])
        row["details"] += r.get("details", [])
    return list(rows.values())


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group (workers stop cleanly), then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    # Workers may outlive a child that exited; the group id is still the child's pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run_job(job: dict, logs: Path) -> dict:
    """Prepare the side's scratch state, run the job in a child process group, read its result."""
    env = {"BENCH_LOG_DIR": str(logs)}
    if job["side"] == "ours":
        # A fresh database and broker for every PAL Ops scenario.
        common.pg_recreate(common.OURS_DB)
        common.redis_flush(common.OURS_REDIS_DB)
        env.update(common.ours_env())
    env.update(job.get("env", {}))
    spec = {k: job[k] for k in ("module", "func", "kwargs")}
    spec["calls"] = job.get("calls", 1)
    log_path = logs / f"{job['scenario']}-{job['side']}-{job['variant'].replace(' ', '_')}-{job['round']}.log"
    started = time.monotonic()
    loadavg = round(os.getloadavg()[0], 2)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [common.PYTHON, "-m", "bench.child", json.dumps(spec)],
            cwd=common.ROOT,
            env=common.child_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=job["timeout"])
            result = None
        except subprocess.TimeoutExpired:
            result = {"status": "error", "message": f"timed out after {job['timeout']} s (process group killed)"}
        finally:
            _kill_group(proc)
    if job["side"] == "ours":
        with contextlib.suppress(Exception):
            common.pg_drop(common.OURS_DB)
    if result is None:
        result = {"status": "error", "message": f"child exited {proc.returncode} without a result; see {log_path}"}
        for line in reversed(log_path.read_text(errors="replace").splitlines()):
            if line.startswith("BENCH_RESULT "):
                result = json.loads(line[len("BENCH_RESULT ") :])
                break
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["loadavg"] = loadavg
    result["log"] = str(log_path)
    return {**{k: job[k] for k in ("scenario", "side", "variant", "kwargs")}, **result}


def _default_out(quick: bool, scenarios: set[str], sides: set[str]) -> str:
    """docs/PERFORMANCE.md only for a full run: a run of some scenarios or sides must not replace the others'."""
    if quick:
        return "var/PERFORMANCE-quick.md"
    if scenarios != set(SCENARIOS) or sides != set(SIDES):
        only = "" if sides == set(SIDES) else "-" + "-".join(sorted(sides))
        return f"var/PERFORMANCE-{''.join(sorted(scenarios))}{only}.md"
    return "docs/PERFORMANCE.md"


def preflight() -> list[str]:
    problems = []
    try:
        common.pg_facts()
    except Exception as exc:
        problems.append(f"Postgres at {common.PG_URL}: {exc}")
    try:
        common.redis_version()
    except Exception as exc:
        problems.append(f"Redis at {common.REDIS_URL}: {exc}")
    return problems


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds through run_job's finally, which kills the child's group


def _commit_exists(ref: str) -> bool:
    found = subprocess.run(["git", "-C", str(common.ROOT), "cat-file", "-e", f"{ref}^{{commit}}"], capture_output=True)
    return found.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="same sizes, fewer repeats: a smoke check (written to var/PERFORMANCE-quick.md)",
    )
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma list of {', '.join(SIDES)}")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    parser.add_argument(
        "--out",
        type=Path,
        help="report path (default docs/PERFORMANCE.md; var/PERFORMANCE-<scenarios>.md when only some run)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON here")
    args = parser.parse_args(argv)
    sides = {s.strip() for s in args.sides.split(",") if s.strip()}
    scenarios = {s.strip().upper() for s in args.scenarios.split(",") if s.strip()}
    if not sides <= set(SIDES) or not scenarios <= set(SCENARIOS):
        parser.error(f"--sides takes {', '.join(SIDES)}; --scenarios takes {', '.join(SCENARIOS)}")
    out = args.out or (common.ROOT / _default_out(args.quick, scenarios, sides))

    problems = preflight()
    if problems:
        for problem in problems:
            print(f"bench: cannot reach {problem}", file=sys.stderr)
        print(
            "bench: start Postgres (role pal/pal, superuser) and Redis on 127.0.0.1, or set BENCH_PG_URL and"
            " BENCH_REDIS_URL",
            file=sys.stderr,
        )
        return 2

    if not args.quick:
        for variable, ref in BEFORE_REFS.items():
            if variable not in os.environ and _commit_exists(ref):
                os.environ[variable] = ref
    signal.signal(signal.SIGTERM, _on_sigterm)
    logs = Path(tempfile.mkdtemp(prefix="pal-bench-"))
    p = plan(args.quick)
    facts = common.machine_facts()
    facts["loadavg_start"] = os.getloadavg()
    started = time.monotonic()
    results = []
    print(f"bench: {'quick' if args.quick else 'full'} run; logs in {logs}", flush=True)
    try:
        for job in jobs(p):
            if job["scenario"] not in scenarios or job["side"] not in sides:
                continue
            print(
                f"bench: {job['scenario']} {job['side']} ({job['variant']}) round {job['round']} ...",
                end=" ",
                flush=True,
            )
            result = run_job(job, logs)
            results.append(result)
            print(report.summary_line(result), flush=True)
    except KeyboardInterrupt:
        print("\nbench: interrupted; workers stopped, no report written", file=sys.stderr)
        return 130
    facts["loadavg_end"] = os.getloadavg()
    facts["total_seconds"] = round(time.monotonic() - started, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = merge(results)
    out.write_text(report.render(results=rows, facts=facts, plan=p, quick=args.quick))
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "plan": p, "rounds": results, "results": rows}, indent=2))
    print(f"bench: wrote {out} in {facts['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Turn the harness's results into docs/PERFORMANCE.md: one table per scenario, medians, spread,
ratios against PAL Ops, the machine, the date and how each figure was measured."""

from __future__ import annotations

import datetime as dt
import math

from bench.common import median, percentile

NOT_YET = "not measured yet"

NAMES = {"ours": "PAL Ops", "dbos": "DBOS Transact", "celery": "bare Celery"}

HOW = {
    ("A", "ours", "run_drive"): "one run of 1,000 no-op steps driven by `runs.executor.run_drive` in one process; "
                                "wall time / steps (bench/ours.py)",
    ("A", "dbos", "workflow"): "one `@DBOS.workflow` calling a no-op `@DBOS.step` 1,000 times, called directly in "
                               "one process; wall time / steps",
    ("A", "celery", "chain"): "1 worker process (`--pool solo`); a chain of 1,000 no-op tasks, each sending the "
                              "next; first send to last done / steps",
    ("A", "celery", "roundtrip"): "1 worker process (`--pool solo`); 1,000 sequential `noop.delay().get()` round "
                                  "trips (Redis result backend); wall time / steps",
    ("B", "ours", "celery workers"): "200 runs of 10 no-op steps over 2 `celery -A pal worker --pool solo` "
                                     "processes; first create to last finish (bench/ours.py)",
    ("B", "dbos", "queue"): "2 worker processes listening on one DBOS queue (worker_concurrency 100, polled every "
                            "0.1 s); 200 workflows of 10 steps enqueued with `DBOSClient`; first enqueue to last "
                            "`updated_at`",
    ("B", "dbos", "direct"): "2 processes, each `DBOS.start_workflow` of 100 workflows of 10 steps on a common go "
                             "(threads, no queue); go to last process done",
    ("B", "celery", "chains"): "2 worker processes (`--pool solo`); 200 chains of 10 no-op tasks sent at once; first "
                               "send to last chain done",
    ("C", "ours", "kill -9"): "kill -9 of the worker holding a run, PAL_RECOVERY_INTERVAL=5, PAL_LEASE_TTL=5; "
                              "kill to the run's next step done on another worker",
    ("D", "ours", "sweep"): "one recovery sweep over finished runs plus stuck runs with expired leases",
}


def _fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _label(r: dict) -> str:
    return f"{NAMES[r['side']]} ({r['variant']})"


def _values(r: dict, scale: float) -> list[float]:
    return [v * scale for v in r.get("values", [])]


def summary_line(r: dict) -> str:
    """One line for the terminal."""
    if r["status"] == "not_implemented":
        return f"{NOT_YET} ({r['wall_seconds']} s)"
    if r["status"] != "ok":
        return f"ERROR: {r['message']} ({r['wall_seconds']} s; log {r['log']})"
    unit, scale = _UNITS[r["scenario"]]
    vals = _values(r, scale)
    return f"median {_fmt(median(vals))} {unit} over {len(vals)} ({r['wall_seconds']} s)"


# scenario -> (unit shown, scale from the value the side returns)
_UNITS = {"A": ("ms/step", 1000.0), "B": ("steps/s", 1.0), "C": ("s", 1.0), "D": ("s", 1.0)}


def _cell(r: dict) -> tuple[str, str, str, str]:
    """median, spread (p90 for times; min–max for throughput, where the slow tail is the low end),
    repeats, raw values."""
    if r["status"] == "not_implemented":
        return NOT_YET, "", "", ""
    if r["status"] != "ok":
        return f"error: {r['message'][:160]}", "", "", ""
    _, scale = _UNITS[r["scenario"]]
    vals = _values(r, scale)
    raw = ", ".join(_fmt(v) for v in vals)
    spread = f"{_fmt(min(vals))} – {_fmt(max(vals))}" if r["scenario"] == "B" else _fmt(percentile(vals, 90))
    return _fmt(median(vals)), spread, str(len(vals)), raw


def _ours(results: list[dict], scenario: str) -> dict | None:
    for r in results:
        if r["scenario"] == scenario and r["side"] == "ours":
            return r
    return None


def _ratio(scenario: str, r: dict, ours: dict | None) -> str:
    """How many times faster PAL Ops is than this row (above 1: PAL Ops faster)."""
    if r["side"] == "ours":
        return "1.00" if r["status"] == "ok" else "–"
    if ours is None or ours["status"] != "ok":
        return NOT_YET
    if r["status"] != "ok":
        return "–"
    mine, theirs = median(ours["values"]), median(r["values"])
    value = theirs / mine if scenario == "A" else mine / theirs
    return f"{value:.2f}×"


def _table(results: list[dict], scenario: str, value_header: str, spread_header: str) -> list[str]:
    rows = [r for r in results if r["scenario"] == scenario]
    if not rows:
        return ["Not run this time (`--scenarios`/`--sides`).", ""]
    ours = _ours(results, scenario)
    ratio_header = "PAL Ops is … faster" if scenario in ("A", "B") else ""
    header = ["engine (variant)", value_header, spread_header, "repeats", "each repeat", "load (1 min) per round"]
    if ratio_header:
        header.append(ratio_header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        med, p90, n, raw = _cell(r)
        cells = [_label(r), med, p90, n, raw, ", ".join(f"{x:.1f}" for x in r.get("loadavg", []))]
        if ratio_header:
            cells.append(_ratio(scenario, r, ours))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("How each row was measured:")
    lines.append("")
    for r in rows:
        lines.append(f"- {_label(r)}: {HOW.get((scenario, r['side'], r['variant']), '')}.")
    lines.append("")
    return lines


def _targets(results: list[dict]) -> list[str]:
    ours = _ours(results, "A")
    dbos = next((r for r in results if r["scenario"] == "A" and r["side"] == "dbos"), None)
    if ours is None or ours["status"] != "ok":
        return [f"Targets for PAL Ops: ≤ 1.0 ms per step, and ≥ 2.5× faster than DBOS: {NOT_YET}.", ""]
    ms = median(ours["values"]) * 1000
    lines = [f"Targets for PAL Ops: ≤ 1.0 ms per step: {ms:.2f} ms, {'met' if ms <= 1.0 else 'not met'}"]
    if dbos is not None and dbos["status"] == "ok":
        ratio = median(dbos["values"]) / median(ours["values"])
        lines[0] += f"; ≥ 2.5× faster than DBOS: {ratio:.2f}×, {'met' if ratio >= 2.5 else 'not met'}."
    else:
        lines[0] += "; ≥ 2.5× faster than DBOS: DBOS not measured."
    return lines + [""]


def render(*, results: list[dict], facts: dict, plan: dict, quick: bool) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pg = facts.get("postgres", {})
    pg_line = (f"{pg.get('server_version')} on 127.0.0.1 over TCP (synchronous_commit={pg.get('synchronous_commit')}, "
               f"fsync={pg.get('fsync')}, shared_buffers={pg.get('shared_buffers')})"
               if "server_version" in pg else f"unreachable: {pg.get('error')}")
    load_start = ", ".join(f"{x:.2f}" for x in facts.get("loadavg_start", ()))
    load_end = ", ".join(f"{x:.2f}" for x in facts.get("loadavg_end", ()))
    a, b, c, d = plan["A"], plan["B"], plan["C"], plan["D"]
    out = [
        "# Performance",
        "",
        f"Written by `make bench` (`python -m bench{' --quick' if quick else ''}`) on {now}, "
        f"in {facts.get('total_seconds')} s.",
    ]
    if quick:
        out.append("**Quick run: a smoke check with fewer repeats. Do not quote these figures.**")
    out += [
        "All sides ran in one process tree, one after another, against the same local Postgres and Redis. "
        "Compare the ratios, not the absolute times: those depend on the machine, above all on how fast "
        "Postgres can commit (fsync).",
        "",
        "Bare Celery is not durable (no database, no journal): it is the floor a Celery-based engine stands on, "
        "and its ratio is the price of durability over a bare broker hop. DBOS Transact is the durable peer.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {facts.get('cpu')}, nproc {facts.get('nproc')} |",
        f"| memory | {facts.get('mem_gib')} GiB |",
        f"| OS | {facts.get('os')} |",
        f"| PostgreSQL | {pg_line} |",
        f"| one Postgres commit | {pg.get('commit_ms')} ms (median of 200 one-row INSERTs, autocommit, over TCP): "
        "the floor under a step made durable by a commit of its own |",
        f"| Redis | {facts.get('redis_server')} on 127.0.0.1 |",
        f"| Python | {facts.get('python')}: Django {facts.get('Django')}, Celery {facts.get('celery')} "
        f"(kombu {facts.get('kombu')}, redis-py {facts.get('redis')}), psycopg {facts.get('psycopg')}, "
        f"DBOS {facts.get('dbos')} (SQLAlchemy {facts.get('SQLAlchemy')}) |",
        f"| load average (1, 5, 15 min) | {load_start} at the start; {load_end} at the end |",
        "",
    ]
    load1 = (facts.get("loadavg_start") or (0,))[0]
    if facts.get("nproc") and load1 > facts["nproc"]:
        out += [f"The machine was busy when the run began (load {load1:.1f} on {facts['nproc']} cores): "
                "expect noisy figures.", ""]
    out += [
        f"## A. Per-step overhead: one run of {a['steps']:,} no-op steps",
        "",
        f"Milliseconds per step, median and p90 over {a['repeats'] * plan['rounds']} repeats "
        f"({plan['rounds']} round(s) of {a['repeats']}; lower is better). "
        "The ratio is the peer's median ÷ PAL Ops' median.",
        "",
    ]
    out += _targets(results)
    out += _table(results, "A", "median ms/step", "p90 ms/step")
    out += [
        f"## B. Throughput: {b['runs']} runs of {b['steps']} no-op steps, {b['workers']} worker processes",
        "",
        f"Steps per second ({b['runs'] * b['steps']:,} steps per repeat), median and range over "
        f"{b['repeats'] * plan['rounds']} repeats ({plan['rounds']} round(s) of {b['repeats']}; higher is better). "
        "The ratio is PAL Ops' median ÷ the peer's median.",
        "",
    ]
    out += _table(results, "B", "median steps/s", "min – max steps/s")
    out += [
        f"## C. Crash to resume after kill -9 (PAL Ops only; PAL_RECOVERY_INTERVAL={c['recovery_interval']}, "
        f"PAL_LEASE_TTL={c['lease_ttl']})",
        "",
        "Seconds, median and p90 over the repeats (lower is better).",
        "",
    ]
    out += _table(results, "C", "median s", "p90 s")
    out += [
        f"## D. Sweep time with {d['finished']:,} finished runs and {d['stuck']:,} stuck ones (PAL Ops only)",
        "",
        "Seconds per sweep, median and p90 over the repeats (lower is better).",
        "",
    ]
    out += _table(results, "D", "median s", "p90 s")
    out += [
        "## Method",
        "",
        "- A and B run in rounds: each round runs every side once, in turn, so load from elsewhere on the "
        "machine is shared out rather than falling on one side. The load column is the 1-minute load "
        "average when each round of that row began.",
        "- Every measurement runs in its own child process (`python -m bench.child`), with its own scratch "
        "state: Postgres databases `pal_bench_ours` and `pal_bench_dbos` created before and dropped after, "
        "Redis databases 14 (PAL Ops) and 15 (bare Celery) flushed. The developer's `pal` database is not touched.",
        "- Worker processes are real subprocesses (`celery … worker --pool solo`, or `python -m bench.peers_dbos "
        "worker`); their start-up and a short warm-up run are outside every timing.",
        "- p90 uses linear interpolation between the repeats, so with few repeats it sits close to the slowest one.",
        "- Nothing here is a test: no figure passes or fails a build.",
        "",
        "Reproduce: `make bench`, or `.venv/bin/python -m bench [--quick] [--sides ours,dbos,celery] "
        "[--scenarios A,B,C,D]` with Postgres and Redis on 127.0.0.1 (`BENCH_PG_URL`, `BENCH_REDIS_URL` to point "
        "elsewhere) and `requirements-bench.txt` installed.",
        "",
    ]
    return "\n".join(out)

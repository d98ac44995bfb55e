"""Turn the harness's results into docs/PERFORMANCE.md: one table per scenario, medians, spread,
ratios against PAL Ops, the machine, the date and how each figure was measured."""

from __future__ import annotations

import datetime as dt
import statistics

from bench import flat, real_path, report_api
from bench.common import median, percentile
from bench.how import HOW, NOT_YET, _fmt, _how, _not_ok

# The hand-written commentary lives in a page of its own, which a run of the bench never writes.
NOTES = (
    "This page is generated: edit bench/report.py, not the page. What the figures mean, earlier runs, profiles and "
    "what each change did: [PERFORMANCE-notes.md](PERFORMANCE-notes.md), written by hand."
)

NAMES = {"ours": "PAL Ops", "dbos": "DBOS Transact", "celery": "bare Celery"}


def _label(r: dict) -> str:
    return f"{NAMES[r['side']]} ({r['variant']})"


def _values(r: dict, scale: float) -> list[float]:
    return [v * scale for v in r.get("values", [])]


def summary_line(r: dict) -> str:
    """One line for the terminal."""
    if r["status"] == "not_implemented":
        return f"{NOT_YET} ({r['wall_seconds']} s)"
    if r["status"] == "skipped":
        return f"skipped: {r['message']} ({r['wall_seconds']} s)"
    if r["status"] != "ok":
        return f"ERROR: {r['message']} ({r['wall_seconds']} s; log {r['log']})"
    if r["scenario"] == "E":
        return (
            "; ".join(
                f"{p.get('server', '')} {p['endpoint']} #{p['repeat']} {p['rps']:.0f} req/s, "
                f"p99 {p['p99_ms']:.1f} ms, non-2xx {p['non_2xx']}"
                for d in r.get("details", [])
                for p in d["passes"]
            )
            + f" ({r['wall_seconds']} s)"
        )
    if r["scenario"] == "J":
        return flat.summary_line(r)
    if r["scenario"] == "A" and r["variant"].startswith(real_path.VARIANT):
        return real_path.summary_line(r)
    if r["scenario"] == "F":
        d = r["details"][-1]
        return (
            f"{d['answered_200']}/{d['streams']} answered 200, {d['full_replay']}/{d['streams']} replayed, "
            f"RSS {d['rss_before_mib']} -> {d['rss_idle_mib']} MiB, "
            f"CPU {d['cpu_percent_idle']}% idle, threads {d['threads_before']} -> {d['threads_idle']}, "
            f"{d['closed_after_cancel']} closed after cancel ({r['wall_seconds']} s)"
        )
    if r["variant"] == IDLE:
        looks = (
            f"look {name}: {d['statements_per_minute']} statements/min, {d['sweeps_per_minute']} sweeps/min"
            for name, d in _idle(r).items()
        )
        return "; ".join(looks) + f" ({r['wall_seconds']} s)"
    unit, scale = _UNITS[r["scenario"]]
    vals = _values(r, scale)
    return f"median {_fmt(median(vals))} {unit} over {len(vals)} ({r['wall_seconds']} s)"


# scenario -> (unit shown, scale from the value the side returns)
_UNITS = {
    "A": ("ms/step", 1000.0),
    "B": ("steps/s", 1.0),
    "C": ("s", 1.0),
    "D": ("s", 1.0),
    "G": ("items/s", 1.0),
    "H": ("× the sleep", 1.0),
}
# Scenarios whose figure is a rate: the spread shown is min to max (the slow tail is the low end).
_RATES = ("B", "G")


def _cell(r: dict) -> tuple[str, str, str, str]:
    """median, spread (p90 for times; min–max for throughput, where the slow tail is the low end),
    repeats, raw values."""
    if r["status"] == "not_implemented":
        return NOT_YET, "", "", ""
    if r["status"] == "skipped":
        return f"skipped: {r['message'][:160]}", "", "", ""
    if r["status"] != "ok":
        return f"error: {r['message'][:160]}", "", "", ""
    _, scale = _UNITS[r["scenario"]]
    vals = _values(r, scale)
    raw = ", ".join(_fmt(v) for v in vals)
    spread = f"{_fmt(min(vals))} – {_fmt(max(vals))}" if r["scenario"] in _RATES else _fmt(percentile(vals, 90))
    return _fmt(median(vals)), spread, str(len(vals)), raw


def _ours(results: list[dict], scenario: str) -> dict | None:
    for r in results:
        if r["scenario"] == scenario and r["side"] == "ours":
            return r
    return None


def _ratio(scenario: str, r: dict, ours: dict | None) -> str:
    """How many times faster PAL Ops is than this row (above 1: PAL Ops faster); `ours` is the scenario's first
    PAL Ops row (G has a second one, the plain list, compared to the fan-out like a peer)."""
    if r is ours:
        return "1.00" if r["status"] == "ok" else "–"
    if r["variant"].startswith(real_path.VARIANT):
        return "–"  # the same engine on the path users get: compared with the walk in one process below the table
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
    ratio_header = {"A": "PAL Ops is … faster", "B": "PAL Ops is … faster", "G": "PAL Ops (for_each) is … faster"}.get(
        scenario, ""
    )
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


IDLE = "idle fleet"  # scenario C's idle-load row (issue 15 section 2), shown below C's table, not in it


def _idle(r: dict) -> dict:
    return next((d["idle"] for d in r.get("details", []) if "idle" in d), {})


def _idle_table(results: list[dict]) -> list[str]:
    """C: what an idle fleet asks of the database with the look at lease expiry on and off."""
    rows = [r for r in results if r["scenario"] == "C" and r["variant"] == IDLE]
    if not rows:
        return []
    r = rows[0]
    lines = ["With nothing to recover (an idle fleet's cost: the database's transactions a minute):", ""]
    if r["status"] != "ok":
        return [*lines, f"Idle fleet: {_not_ok(r)}.", ""]
    idle = _idle(r)
    lines += [
        "| look at lease expiry | transactions / min (server) | statements / min (workers) | tasks / min "
        "| sweeps / min "
        "| statements per idle sweep |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("on", "off", *sorted(set(idle) - {"on", "off"})):  # then the code before (BENCH_C_BEFORE_REF)
        d = idle.get(name)
        if d:
            lines.append(
                f"| {name} | {_fmt(d.get('transactions_per_minute'), 1)} | {_fmt(d['statements_per_minute'], 1)} | "
                f"{_fmt(d['tasks_per_minute'], 1)} | "
                f"{_fmt(d['sweeps_per_minute'], 1)} | {d['statements_per_sweep']} |"
            )
    lines += ["", *_how(r)]
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
    return [*lines, ""]


def _pure_targets(results: list[dict], commit_ms: float | None) -> list[str]:
    """Issue 29 section 2: a pure no-op step on the real path against one commit (aim <= 1.5x), beside the path
    of a step with an effect (PAL_PURE_BATCH_MS=0: a commit per step), in the walk and through a worker."""

    def ms(variant: str) -> float | None:
        row = next(
            (r for r in results if r["scenario"] == "A" and r["variant"] == variant and r["status"] == "ok"), None
        )
        return median(row["values"]) * 1000 if row else None

    pure, each = ms(real_path.variant(1000)), ms(real_path.variant(1000, commit_each=True))
    inline, inline_each = ms("run_drive"), ms("run_drive, a commit per step")
    if pure is None or not commit_ms:
        return [f"Pure steps (issue 29): within 1.5× one commit per pure no-op step on the real path: {NOT_YET}.", ""]
    ratio = pure / commit_ms
    line = (
        f"Pure steps (issue 29): echo is pure, so its rows share commits (PAL_PURE_BATCH_STEPS, PAL_PURE_BATCH_MS). "
        f"Through a worker a pure no-op step costs {pure:.3f} ms = {ratio:.2f}× one commit ({commit_ms} ms): aim "
        f"≤ 1.5×, {'met' if ratio <= 1.5 else 'not met'}."
    )
    if each is not None:
        line += f" The same steps each with a commit of their own (a step with an effect's path): {each:.3f} ms"
        line += f" through a worker, {inline_each:.3f} ms in the walk alone." if inline_each else " through a worker."
    if inline is not None:
        line += f" Pure in the walk alone: {inline:.3f} ms."
    return [line, ""]


def _fan_out_targets(results: list[dict]) -> list[str]:
    """G's aims (issue 12): within 1.5× of bare Celery's group, ahead of DBOS."""
    ours = _ours(results, "G")
    if ours is None or ours["status"] != "ok":
        return [f"Aims for PAL Ops' fan-out: within 1.5× of bare Celery's group, ahead of DBOS: {NOT_YET}.", ""]
    mine = median(ours["values"])
    parts = []
    celery = next((r for r in results if r["scenario"] == "G" and r["side"] == "celery" and r["status"] == "ok"), None)
    if celery is not None:
        behind = median(celery["values"]) / mine
        verdict = "met" if behind <= 1.5 else "not met"
        parts.append(f"within 1.5× of bare Celery's group: the group's rate is {behind:.2f}× PAL Ops', {verdict}")
    dbos = [r for r in results if r["scenario"] == "G" and r["side"] == "dbos" and r["status"] == "ok"]
    if dbos:
        best = max(median(r["values"]) for r in dbos)
        parts.append(f"ahead of DBOS (its best variant): {mine / best:.2f}×, {'met' if mine > best else 'not met'}")
    return ["Aims for PAL Ops' fan-out: " + ("; ".join(parts) or "no peer measured") + ".", ""]


_DETAIL_NAMES = {
    "journal_seconds": "seconds from `run_started` to `run_succeeded` in the journal",
    "walking_processes": "worker processes that wrote its steps (a walk hands over after each slice)",
    "send_seconds": "seconds the sending process spent publishing the group",
}


def _details(results: list[dict], scenario: str) -> list[str]:
    """The figures behind a row that are not its value, one line a row (G, H)."""
    lines = []
    for r in results:
        if r["scenario"] != scenario or r["status"] != "ok" or not r.get("details"):
            continue
        parts = []
        for name, label in _DETAIL_NAMES.items():
            values = [v for d in r["details"] for v in d.get(name, [])]
            if values:
                parts.append(f"{label}: {', '.join(str(v) for v in values)}")
        if parts:
            lines.append(f"- {_label(r)}: {'; '.join(parts)}.")
    return ["Behind the figures:", "", *lines, ""] if lines else []


def _parallel_target(results: list[dict]) -> list[str]:
    ours = _ours(results, "H")
    if ours is None or ours["status"] != "ok":
        return [f"Aim: ≤ 1.2× the sleep: {NOT_YET}.", ""]
    ratio = median(ours["values"])
    return [f"Aim: ≤ 1.2× the sleep: {ratio:.2f}×, {'met' if ratio <= 1.2 else 'not met'}.", ""]


def render(*, results: list[dict], facts: dict, plan: dict, quick: bool) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    pg = facts.get("postgres", {})
    pg_line = (
        f"{pg.get('server_version')} on 127.0.0.1 over TCP (synchronous_commit={pg.get('synchronous_commit')}, "
        f"fsync={pg.get('fsync')}, shared_buffers={pg.get('shared_buffers')})"
        if "server_version" in pg
        else f"unreachable: {pg.get('error')}"
    )
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
        NOTES,
        "",
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
        out += [
            f"The machine was busy when the run began (load {load1:.1f} on {facts['nproc']} cores): "
            "expect noisy figures.",
            "",
        ]
    out += [
        f"## A. Per-step overhead: one run of {a['steps']:,} no-op steps",
        "",
        f"Milliseconds per step, median and p90 over {a['repeats'] * plan['rounds']} repeats "
        f"({plan['rounds']} round(s) of {a['repeats']}; lower is better). "
        "The ratio is the peer's median ÷ PAL Ops' median.",
        "",
    ]
    out += _targets(results)
    out += _pure_targets(results, pg.get("commit_ms"))
    out += _table(results, "A", "median ms/step", "p90 ms/step")
    out += real_path.report_section(results)
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
    out += _table([r for r in results if r["variant"] != IDLE], "C", "median s", "p90 s")
    out += _idle_table(results)
    out += [
        f"## D. Sweep time with {d['finished']:,} finished runs and {d['stuck']:,} stuck ones (PAL Ops only)",
        "",
        "Seconds per sweep, median and p90 over the repeats (lower is better).",
        "",
    ]
    out += _table(results, "D", "median s", "p90 s")
    for r in results:
        if r["scenario"] == "D" and r.get("details"):
            empty = [v for d in r["details"] for v in d.get("with_no_finished_runs", [])]
            if empty:
                out += [
                    f"The same sweep with no finished runs: median {statistics.median(empty):.2f} s "
                    f"(each repeat: {', '.join(f'{v:.2f}' for v in empty)}).",
                    "",
                ]
    e, f = plan["E"], plan["F"]
    out += [
        "## E. REST API under load: `POST /runs`, `GET /runs/{id}`, `POST /runs/batch` (PAL Ops only)",
        "",
        f"`wrk -t{e['threads']} -c{e['connections']} -d{e['duration']}s` per endpoint, server path and repeat, against "
        "ONE uvicorn worker process (`--workers 1`; the machine's cores are shared by uvicorn, wrk and Postgres) on "
        "Postgres. Requests/s higher is better, latencies lower; every non-2xx answer is counted, and so are "
        "socket errors (connect, read, write, timeout after 10 s). The aims (issue 29 section 3, after issue 15's "
        "400 and 600): 800 `GET /runs/{id}` a second per process with p99 under 50 ms at 16 connections, 600 "
        "`POST /runs`; `POST /runs/batch` of 100 runs at 2,000 runs/s or more.",
        "",
    ]
    out += report_api.api_aims(results)
    out += report_api.api_table(results)
    out += [
        f"## F. {f['streams']} event streams held open (PAL Ops only)",
        "",
        f"{f['streams']} `GET /runs/{{id}}/events/stream` connections open at once on ONE uvicorn worker process, "
        f"idle for {f['idle_seconds']} s (their runs wait on an approval; the window is one keep-alive period, "
        "PAL_STREAM_KEEPALIVE's default 15 s, so each open stream sends about one keep-alive in it), then closed by "
        "cancelling the runs.",
        "",
    ]
    out += report_api.streams_table(results)
    g, h = plan["G"], plan["H"]
    out += [
        f"## G. Fan-out: {g['items']:,} no-op items, max_concurrency {g['max_concurrency']}, "
        f"{g['workers']} worker processes",
        "",
        f"Items per second, median and range over {g['repeats'] * plan['rounds']} repeats ({plan['rounds']} round(s) "
        f"of {g['repeats']}; higher is better). The ratio is PAL Ops' fan-out median ÷ the row's median.",
        "",
    ]
    out += _fan_out_targets(results)
    out += _table(results, "G", "median items/s", "min – max items/s")
    out += _details(results, "G")
    out += [
        f"## H. {h['steps']} independent `sleep {h['seconds']}` steps in one run (PAL Ops only)",
        "",
        f"The run's wall time from its journal (`run_started` to `run_succeeded`) ÷ {h['seconds']} s, median and p90 "
        "over the repeats (lower is better; 1.00 would be no overhead at all).",
        "",
    ]
    out += _parallel_target(results)
    out += _table(results, "H", "median × the sleep", "p90")
    out += _details(results, "H")
    out += flat.report_section(results, plan)
    out += [
        "## Method",
        "",
        "- A, B and G run in rounds: each round runs every side once, in turn, so load from elsewhere on the "
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
        "[--scenarios A,B,C,D,E,F,G,H,J]` (or `make bench BENCH_ARGS=--scenarios=G,H`) "
        "with Postgres and Redis on 127.0.0.1 (`BENCH_PG_URL`, `BENCH_REDIS_URL` to point "
        "elsewhere), `requirements-bench.txt` installed and, for E, `wrk` (Debian package; `make bench` installs it "
        "when run as root).",
        "",
        "## More figures",
        "",
        "- [PERFORMANCE-notes.md](PERFORMANCE-notes.md): notes on these figures, by hand (the bench does not "
        "write it).",
        "- [PERFORMANCE-chain.md](PERFORMANCE-chain.md): the journal append with the hash chain against the same "
        "append without it (`python -m bench.chain_append`).",
        "- [PERFORMANCE-pages.md](PERFORMANCE-pages.md): the run page of a run with 10,000 journal events, rendered "
        "server-side (`python -m tests.pages.bench_run_page`).",
        "- [PERFORMANCE-code.md](PERFORMANCE-code.md): the measurements behind the shape of the code (why a module "
        "does what it does), cited from its comments.",
        "- [PERFORMANCE-notes.md](PERFORMANCE-notes.md): commentary on a round's figures (issue 29: the real path's "
        "hand-offs, the read path's profile and its interleaved runs).",
        "",
    ]
    return "\n".join(out)

"""docs/PERFORMANCE.md's sections of the REST API: E (requests under wrk, the views' own time, the aims) and F (event
streams held open)."""

from __future__ import annotations

from bench.common import median
from bench.how import _fmt, _how, _not_ok

# What py-spy showed of the server path before and after issue 15 section 1 (kept with the tables: a run of the
# bench measures the figures, not where they come from).


# Issue 29 section 3's aims for pal.web's sync path: (requests/s at least, p99 ms under or None) per endpoint.
AIMS = {"GET /runs/{id}": (800, 50.0), "POST /runs": (600, None)}
SYNC_PATH = "sync path"


def api_aims(results: list[dict]) -> list[str]:
    """One line: each aim of the sync path, met or not, by the median requests/s and the largest p99 of its passes."""
    passes = [
        p
        for r in results
        if r["scenario"] == "E" and r["status"] == "ok"
        for d in r.get("details", [])
        for p in d["passes"]
        if p.get("server") == SYNC_PATH
    ]
    parts = []
    for endpoint, (rps_aim, p99_aim) in AIMS.items():
        mine = [p for p in passes if p["endpoint"] == endpoint]
        if not mine:
            continue
        rps = median([p["rps"] for p in mine])
        p99 = max(p["p99_ms"] for p in mine)
        met = rps >= rps_aim and (p99_aim is None or p99 < p99_aim)
        wanted = f"{rps_aim:,} a second" + (f", p99 under {p99_aim:g} ms" if p99_aim is not None else "")
        parts.append(
            f"`{endpoint}` {rps:,.0f} a second (median of {len(mine)}), p99 at most {p99:.1f} ms against "
            f"{wanted}: {'met' if met else 'not met'}"
        )
    return ["Aims, on the sync path: " + "; ".join(parts) + ".", ""] if parts else []


def api_table(results: list[dict]) -> list[str]:
    """E: the views' own time, then one line per server path, endpoint and repeat."""
    rows = [r for r in results if r["scenario"] == "E"]
    if not rows:
        return ["Not run this time (`--scenarios`/`--sides`).", ""]
    lines = []
    for r in rows:
        if r["status"] != "ok":
            lines += [_not_ok(r), "", *_how(r)]
            continue
        for d in r.get("details", []):
            if d.get("views"):
                lines += [
                    "The views' own time (Django's test client in the bench process, one request at a time):",
                    "",
                    "| endpoint | ms per request | CPU ms per request | queries per request |",
                    "|---|---|---|---|",
                ]
                for v in d["views"].values():
                    lines.append(f"| `{v['endpoint']}` | {_fmt(v['wall_ms'])} | {_fmt(v['cpu_ms'])} | {v['queries']} |")
                lines.append("")
        header = [
            "server path",
            "endpoint",
            "repeat",
            "requests/s",
            "runs/s",
            "median ms",
            "p99 ms",
            "max ms",
            "requests",
            "non-2xx",
            "socket errors",
            "uvicorn CPU (% of 1 core)",
            "uvicorn CPU ms per answer",
            "server path overhead",
            "load (1 min)",
        ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for d in r.get("details", []):
            for p in d["passes"]:
                overhead = p.get("overhead")
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            p.get("server", "Django ASGI handler"),
                            f"`{p['endpoint']}`",
                            str(p["repeat"]),
                            _fmt(p["rps"]),
                            _fmt(p["runs_per_s"]) if p.get("runs_per_s") else "–",
                            _fmt(p["p50_ms"]),
                            _fmt(p["p99_ms"]),
                            _fmt(p["max_ms"]),
                            f"{p['requests']:,}",
                            f"{p['non_2xx']:,}",
                            f"{p['socket_errors']:,}",
                            f"{p['server_cpu_percent']:.0f}",
                            _fmt(p["server_cpu_ms"]) if p.get("server_cpu_ms") else "–",
                            f"{overhead * 100:+.0f} %" if overhead is not None else "–",
                            ", ".join(f"{x:.1f}" for x in r.get("loadavg", [])),
                        ]
                    )
                    + " |"
                )
        lines.append("")
        lines += _how(r)
    return lines


def streams_table(results: list[dict]) -> list[str]:
    """F: one figure a line."""
    rows = [r for r in results if r["scenario"] == "F"]
    if not rows:
        return ["Not run this time (`--scenarios`/`--sides`).", ""]
    lines = []
    for r in rows:
        if r["status"] != "ok":
            lines += [_not_ok(r), "", *_how(r)]
            continue
        d = r["details"][-1]
        n = d["streams"]
        per_stream = d["rss_per_stream_kib"]
        lines += [
            "| figure | value |",
            "|---|---|",
            f"| streams opened (answered 200) | {d['answered_200']} of {n} |",
            f"| streams that got every replayed event | {d['full_replay']} of {n} "
            f"({d['events_replayed']:,} events received, {d['events_expected']:,} in the runs' journals) |",
            f"| time until every stream had its replay (or had failed) | {d['open_seconds']} s "
            f"(uvicorn CPU {d['cpu_seconds_open']} s) |",
            f"| still open at the end of the idle window | {d['open_at_idle_end']} of {n} |",
            f"| uvicorn RSS | {d['rss_before_mib']} MiB before the streams, {d['rss_idle_mib']} MiB in the idle window "
            f"(largest of 1-s samples): "
            + (
                f"{per_stream} KiB per stream |"
                if per_stream is not None
                else f"no per-stream figure, {d['open_at_idle_end']} of {n} streams open |"
            ),
            f"| uvicorn threads | {d['threads_before']} before the streams, {d['threads_idle']} in the idle window |",
            f"| uvicorn CPU in the idle window | {d['cpu_percent_idle']} % of one core over {d['idle_seconds']} s "
            f"(1-s samples from {min(x['cpu_percent'] for x in d['samples'])} to "
            f"{max(x['cpu_percent'] for x in d['samples'])} %) |",
            f"| Postgres connections to the scratch database while idle | {d['pg_connections_idle_max']} at most "
            f"(all uvicorn's; 1-s samples), {d['pg_connections_before']} before the streams |",
            f"| after cancelling the {n} runs (one after another, through the service) | {d['got_run_cancelled']} "
            f"streams got run_cancelled, {d['closed_after_cancel']} closed then"
            + (
                f", the last {d['close_seconds']} s after the first cancel |"
                if d["close_seconds"] is not None
                else " |"
            ),
            f"| answers | {', '.join(f'{k}: {v}' for k, v in d['answers'].items())} |",
            f"| streams the server ended before the cancel | {d['ended_before_cancel']} |",
            f"| stream errors | {d['errors']}"
            f"{' (' + '; '.join(f'{k}: {v}' for k, v in d['error_kinds'].items()) + ')' if d['error_kinds'] else ''} |",
            f"| Postgres max_connections | {d['pg_max_connections']} |",
            f"| load (1 min) when it began | {', '.join(f'{x:.1f}' for x in r.get('loadavg', []))} |",
            "",
        ]
        lines += _how(r)
    return lines

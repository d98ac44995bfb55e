"""docs/PERFORMANCE.md's sections of the REST API: E (requests under wrk, the views' own time, the aims) and F (event
streams held open)."""

from __future__ import annotations

from bench.common import median
from bench.how import _fmt, _how, _not_ok

# What py-spy showed of the server path before and after issue 15 section 1 (kept with the tables: a run of the
# bench measures the figures, not where they come from).
E_PROFILE = [
    "Where the time went (py-spy of the uvicorn process under `wrk -c16`, GET /runs/{id}, samples holding the "
    "GIL): before, Django's ASGI handler made a new thread per request (ThreadSensitiveContext) and ran each of the "
    "seven sync middlewares' process_request and process_response through sync_to_async, a hop from the event loop "
    "to that thread and back each time: `SyncToAsync` / `run_in_executor` / `Thread.start` were 37 % of the "
    "samples, the psycopg pool's check of a connection on every checkout 8 % of the wall time, and in the view the "
    "token check's queryset (select_related user) cost more to compile than Postgres took to answer it (about 1 ms "
    "a call; a non-superuser's role check added two more ORM queries for its permissions). After: `pal.web` hands "
    "a sync view's request to one of `PAL_WEB_THREADS` threads in one hop, the middleware chain loaded in sync "
    "mode (as under WSGI); the token with its user, the user's permissions, the run with its workflow and lease, "
    "and a workflow are read by SQL built once from the models (`pal.rows`); a new run's answer does not read back "
    "the journal it has just written. GET /runs/{id}: 4 queries before, 3 (a non-superuser: 6 before, 4); "
    "POST /runs: 12 statements before, 11 (as Django counts them, BEGIN and COMMIT included); each run of a batch: "
    "7 before, 6.",
    "",
    "What is left in POST /runs and POST /runs/batch is per run and outside the web path: the Celery message "
    "(kombu's publish, a Redis client made for each: about a quarter of a POST's samples), the lease booking (an "
    "UPDATE that misses, then the INSERT) and run_created in its own savepoint, each a statement per run. A batch "
    "of 100 is "
    "600 statements and 100 publishes in one request, which holds it near 265 runs/s on this machine: 2,000 would "
    "need one statement each for the runs, the bookings and the journal rows, and one publish for the batch "
    "(runs.dispatch, runs.leases, journal.services).",
    "",
    "Issue 29 section 3 (no py-spy here: `python -m bench.profile_api server get`, Linux perf of the uvicorn process "
    "under `python -X perf`, and `path get`, cProfile of one web thread's requests): a third of uvicorn's CPU "
    "samples were the GIL's futex and the scheduler, pal.web's threads giving the GIL up at each psycopg send and "
    "wait and at the socket look that starts a request, then waiting to get it back; the web threads' own Python "
    "was spread thin (no function over 4 %). So the cuts are round trips and GIL hand-offs: GET /runs/{id} reads its "
    "run in the token's statement (`tokens.auth.TokenAuthWith`, `pal.rows.read_both`: one statement, was two); the "
    "socket look keeps the GIL (`pal.db_pool.has_input`); the run's workflow definition is left unread (a "
    "10,000-step workflow's run: 14.2 ms a GET, now 0.39); the API's header check searches the request's text once "
    "before naming headers; a token's last use is judged by the database's clock in the token's own read. What is "
    "left in POST /runs is its two statements (the token, the run's INSERT and its commit) and its message "
    "(DriveSender's thread: the publish's Redis round trip), each a hand-off, and the run's and its task's ids "
    "(uuid4 reads os.urandom, which gives the GIL up: 3.6 % of the web threads' samples of a POST were that "
    "hand-off). docs/PERFORMANCE-notes.md has the interleaved runs behind each cut.",
    "",
]


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

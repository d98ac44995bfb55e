"""J: flat at scale (issue 15 section 4, issue 13's search line). Every page and list is timed with 1,000 finished
runs, then again after the same database has grown to 1,000,000, and the two medians are compared.

The runs are made in Postgres itself (INSERT ... SELECT generate_series, in chunks; each run with its journal in
the same statement), shaped like a fleet's month: six workflows (one of them rare, one with a model call whose
cost the workflow pages read), succeeded / failed / cancelled, created over the last 30 days, inputs with a few
keys so that an `input` containment filter matches a small share, an error code on each failed run, and each run's
attributes (customer, tier) as run creation writes them; the user has three saved views. After each fill VACUUM
ANALYZE, as autovacuum would have done on a table that grew over a month.

Every surface is asked in this process through Django's test client (the whole Django stack, middleware and
templates included; no HTTP server, so what grows with the table is what is timed), a warm-up first, then
`requests` times; the sweep is `runs.recovery.sweep_once()` called directly. Run alone with
`make bench BENCH_ARGS=--scenarios=J`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from urllib.parse import urlencode

from bench import common

# The workflows of the fill: name -> its steps. The first has a model call (its step_completed events carry usage
# and cost, which /workflows/ reads); "legal-review" is the rare one (RARE runs a fill).
WORKFLOWS = {
    "support-triage": [{"id": "s1", "kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake", "prompt": "hi"}],
    "invoice-extract": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}],
    "nightly-report": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}],
    "lead-enrich": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}],
    "legal-review": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}],
}
RARE_WORKFLOW = "legal-review"
CHUNK = 100_000  # runs per INSERT statement (and commit)
# Each fill holds this many runs of each rare value (the rare workflow, the rare error code, the rare customer),
# spread evenly over it: a rare filter's first page is full (50 runs) on both databases, and the value is far
# sparser in the large one (6 % of 1,000 runs, 0.012 % of 1,000,000), which is the hard case for a newest-first
# walk. (Until session 6 they were shares, 1 in 1,000 or 10,000, so the small database's page held 1 or 2 runs
# and the ratio compared a page of one run with a page of 50.)
RARE = 60

# One statement per chunk: the runs, then their journal (run_created, step_started, step_completed or step_failed,
# and the run's ending), from the rows the first INSERT returned. Row i of the fill decides everything from i:
# 85 % succeeded, 10 % failed, 5 % cancelled; input.customer one of 500, input.region one of 3, input.ticket unique;
# error.code one of four on failed runs. Of every `stride` rows of a fill (RARE a fill), slot 7 is the rare
# workflow's, slot 11 the rare customer "vip"'s, slot 13 a failed run with the rare code "quota_exhausted".
# A fill's runs are created in order over the 30 days (a table that grew over a month holds its runs in about the
# order they came), the second fill's between the first's.
FILL_SQL = """
WITH src AS (
    SELECT g AS i, now() - interval '30 days' * (1 - (g - %(first)s + random()) / %(count)s) AS created,
           (g - %(first)s) %% %(stride)s AS slot
    FROM generate_series(%(start)s, %(stop)s - 1) AS g
), new AS (
    INSERT INTO runs (id, workflow_id, status, input, output, error, trigger_meta, depth, created_by, request_hash,
                      journal_head_seq, journal_head_hash, created_at, updated_at, started_at, finished_at)
    SELECT gen_random_uuid(),
           CASE WHEN slot = 7 THEN %(rare)s ELSE (%(common)s::bigint[])[1 + i %% 5] END,
           CASE WHEN slot = 13 OR i %% 20 < 2 THEN 'failed' WHEN i %% 20 = 2 THEN 'cancelled' ELSE 'succeeded' END,
           jsonb_build_object('customer', CASE WHEN slot = 11 THEN 'vip' ELSE 'c' || (i %% 500) END,
                              'region', (ARRAY['eu', 'us', 'ap'])[1 + i %% 3], 'priority', i %% 10,
                              'ticket', 'T-' || i),
           CASE WHEN slot <> 13 AND i %% 20 >= 3 THEN jsonb_build_object('answer', 'done ' || i) END,
           CASE WHEN slot = 13 OR i %% 20 < 2 THEN jsonb_build_object(
               'code', CASE WHEN slot = 13 THEN 'quota_exhausted'
                            ELSE (ARRAY['timeout', 'rate_limited', 'http_500', 'invalid_output'])[1 + (i / 20) %% 4]
                       END,
               'message', 'step s1 failed', 'step_id', 's1') END,
           '{}', 0, 'bench', '', 4, md5(i::text) || md5(i::text),
           created, created + interval '2 seconds', created + interval '10 milliseconds',
           created + interval '10 milliseconds' + (i %% 600) * interval '50 milliseconds'
    FROM src
    RETURNING id, status, created_at, started_at, finished_at, input
), terms AS (
    {terms}
), attrs AS (
    {attributes}
)
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, hash)
SELECT new.id, e.seq,
       CASE e.seq WHEN 1 THEN 'run_created' WHEN 2 THEN 'step_started'
                  WHEN 3 THEN CASE WHEN new.status = 'failed' THEN 'step_failed' ELSE 'step_completed' END
                  ELSE 'run_' || new.status END,
       CASE WHEN e.seq IN (2, 3) THEN 's1' END,
       CASE WHEN e.seq IN (2, 3) THEN 1 END,
       CASE WHEN e.seq = 3 AND new.status <> 'failed' THEN
                '{"output": {"text": "ok", "usage": {"prompt_tokens": 120, "completion_tokens": 30},
                  "cost_usd": 0.0000360}}'::jsonb
            WHEN e.seq = 3 THEN '{"error": {"code": "timeout", "message": "step s1 failed"}}'::jsonb
            ELSE '{}'::jsonb END,
       CASE e.seq WHEN 1 THEN new.created_at WHEN 4 THEN new.finished_at ELSE new.started_at END,
       'bench-fill', 1, md5(new.id::text || (e.seq - 1)) || md5(new.id::text),
       md5(new.id::text || e.seq) || md5(new.id::text)
FROM new CROSS JOIN generate_series(1, 4) AS e(seq)
"""


# The runs' attributes, as a workflow with "attributes": {"customer": "{{ input.customer }}", "tier": ...} sets them at
# creation (runs.attributes): customer as its input has it (one of 500, or the rare "vip"), tier from the priority
# (gold 40 %, silver 30 %, bronze 30 %). A text's filter form is the text itself (no escapes here).
ATTRIBUTES_SQL = """
INSERT INTO run_attributes (run_id, name, value, text, created_at)
SELECT r.id, a.name, a.value, a.value #>> '{}', r.created_at
FROM new r CROSS JOIN LATERAL (VALUES
    ('customer', r.input -> 'customer'),
    ('tier', to_jsonb((ARRAY['gold', 'silver', 'bronze'])[1 + (r.input ->> 'priority')::int %% 3]))
) AS a(name, value)
"""
# The saved views the fill's user has (name -> filter): a rare customer's, a common tier's failed runs, a common tier.
VIEWS = {
    "vip": {"attr.customer": "vip"},
    "gold failed": {"status": "failed", "attr.tier": "gold"},
    "gold": {"attr.tier": "gold"},
}


def _setup(**env):
    os.environ.update({k: str(v) for k, v in env.items()})
    common.django_setup()


def _prepare() -> dict:
    """A superuser with an API token, the workflows (support-triage in two versions). Returns what the fill and the
    requests need: the token, the user, the workflows' ids."""
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from runs import services

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", None)
    out = io.StringIO()
    call_command("pal_token", "bench", "--name", "bench", stdout=out)
    token = out.getvalue().strip().splitlines()[-1].strip()
    ids = {}
    for name, steps in WORKFLOWS.items():
        ids[name] = services.workflow_create(definition={"name": name, "steps": steps}).id
    ids["support-triage v2"] = services.workflow_create(
        definition={"name": "support-triage", "steps": WORKFLOWS["support-triage"]}
    ).id
    common_ids = [ids[n] for n in ("support-triage", "support-triage v2", "invoice-extract", "nightly-report")]
    common_ids.append(ids["lead-enrich"])
    views = {name: services.view_create(name=name, filter=f, owner=user).id for name, f in VIEWS.items()}
    return {"token": token, "user": user, "common": common_ids, "rare": ids[RARE_WORKFLOW], "views": views}


def fill(*, start: int, stop: int, common_ids: list[int], rare: int) -> float:
    """Rows start..stop-1 of the fill, CHUNK runs a statement, then VACUUM ANALYZE. Returns the seconds it took."""
    from django.db import connection

    from runs.input_terms import terms_sql

    # The runs' input terms and attributes, as run creation writes them.
    statement = FILL_SQL.replace("{terms}", terms_sql("new r")).replace("{attributes}", ATTRIBUTES_SQL)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for low in range(start, stop, CHUNK):
            chunk = {"start": low, "stop": min(stop, low + CHUNK), "first": start, "count": stop - start}
            chunk["stride"] = max(1, (stop - start) // RARE)
            cursor.execute(statement, {**chunk, "common": common_ids, "rare": rare})
        cursor.execute("VACUUM ANALYZE runs")
        cursor.execute("VACUUM ANALYZE journal_events")
        cursor.execute("VACUUM ANALYZE run_input_terms")
        cursor.execute("VACUUM ANALYZE run_attributes")
    return time.perf_counter() - started


# --- the surfaces ----------------------------------------------------------------------------------


def surfaces(*, window: tuple[str, str], parent: str, views: dict[str, int]) -> list[tuple[str, str]]:
    """(label, path) of every page and list timed; the sweep is added by measure()."""
    after, before = window
    filters = [
        ("", {}),
        ("status=failed", {"status": "failed"}),
        ("workflow (common)", {"workflow": "invoice-extract"}),
        ("workflow (rare: 6 % / 0.012 %)", {"workflow": RARE_WORKFLOW}),
        ('input {"region": …} (33 %)', {"input": '{"region": "eu"}'}),
        ('input {"customer": …} (rare: 6 % / 0.012 %)', {"input": '{"customer": "vip"}'}),
        ('input {"ticket": …} (one run)', {"input": '{"ticket": "T-777"}'}),
        ("created_after + created_before (one day)", {"created_after": after, "created_before": before}),
        ("created_after (the last 2 days)", {"created_after": _days_ago(2)}),
        ("error_code (2.5 %)", {"error_code": "timeout"}),
        ("error_code (rare: 6 % / 0.012 %)", {"error_code": "quota_exhausted"}),
        ("status=failed + error_code", {"status": "failed", "error_code": "timeout"}),
    ]
    out = []
    for label, query in filters:
        out.append((f"/runs/ {label}".strip(), "/runs/" + (f"?{urlencode(query)}" if query else "")))
    out += [("/ops/", "/ops/"), ("/workflows/", "/workflows/")]
    api = [
        *filters[:4],
        ("parent", {"parent": parent}),
        ("stuck=true", {"stuck": "true"}),
        *filters[4:],
    ]
    for label, query in api:
        out.append((f"GET /runs {label}".strip(), "/api/v1/runs" + (f"?{urlencode(query)}" if query else "")))
    out.append(("GET /runs page 2 (cursor)", "CURSOR"))
    out += attribute_surfaces(views)
    out.append(("/metrics", "/metrics"))
    return out


def attribute_surfaces(views: dict[str, int]) -> list[tuple[str, str]]:
    """Issue 27: attribute filters, the search box on an attribute's value, and saved views (their first pages,
    the list with its live counts, the runs page with one open)."""
    filters = [
        ("attr.customer (rare: 6 % / 0.012 %)", {"attr.customer": "vip"}),
        ("attr.tier (40 %)", {"attr.tier": "gold"}),
        ("attr.tier + status=failed (4 %)", {"attr.tier": "gold", "status": "failed"}),
        ("attr.customer + attr.tier (rare)", {"attr.customer": "vip", "attr.tier": "gold"}),
        ("q, an attribute's value (rare)", {"q": "vip"}),
    ]
    out = [(f"GET /runs {label}", f"/api/v1/runs?{urlencode(query)}") for label, query in filters]
    out.append(("/runs/ attr.customer (rare)", "/runs/?attr.customer=vip"))
    out += [(f"GET /views/{{id}}/runs ({name})", f"/api/v1/views/{views[name]}/runs") for name in VIEWS]
    out.append((f"GET /views ({len(VIEWS)} views, live counts)", "/api/v1/views"))
    out.append(("/runs/ a view open (vip)", f"/runs/?view={views['vip']}"))
    return out


def _days_ago(days: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S")


class _Databases:
    """Two Django connections under the alias "default", one per database, swapped in before each request: each
    keeps its session (and Postgres its caches), so a swap costs nothing inside a timing."""

    def __init__(self, small: str, large: str):
        from django.db import connections

        first = connections["default"]
        self.names = {"small": small, "large": large}
        self.wrappers = {"small": first, "large": type(first)({**first.settings_dict, "NAME": large}, "default")}

    def use(self, which: str) -> None:
        from django.db import connections

        connections["default"] = self.wrappers[which]
        self.wrappers[which].ensure_connection()

    def close(self) -> None:
        for wrapper in self.wrappers.values():
            wrapper.close()


def _timed(ask, databases: _Databases, *, requests: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of each of `requests` calls of ask() on each database, the two in turn (small, large, small,
    ...), so a burst of load from elsewhere on the machine falls on both; `warmup` calls of each first."""
    times: dict[str, list[float]] = {"small": [], "large": []}
    for number in range(warmup + requests):
        for which in ("small", "large"):
            databases.use(which)
            started = time.perf_counter()
            ask()
            elapsed = (time.perf_counter() - started) * 1000
            if number >= warmup:
                times[which].append(elapsed)
    return times


def measure(ctx: dict, databases: _Databases, *, requests: int, warmup: int) -> list[dict]:
    """One row per surface: its path, each request's milliseconds and the medians on both databases, and, for a
    list, how many runs its first page held on each."""
    from django.test import Client

    from runs.recovery import sweep_once

    pages = Client(HTTP_HOST="127.0.0.1")
    pages.cookies = ctx["cookies"]
    api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {ctx['token']}")
    rows = []
    todo = list(ctx["surfaces"])
    while todo:
        label, path = todo.pop(0)
        client = api if path.startswith(("/api/", "/metrics")) else pages

        def ask(client=client, path=path):
            response = client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.content[:300]!r}")
            return response

        times = _timed(ask, databases, requests=requests, warmup=warmup)
        row = {"surface": label, "path": path, "times": times}
        if path.startswith("/runs/"):  # the page: its rows
            for which in ("small", "large"):
                databases.use(which)
                row[f"{which}_items"] = ask().content.count(b'<tr class="run-row"')
        if path.startswith("/api/v1/runs") or (path.startswith("/api/v1/views/") and path.endswith("/runs")):
            for which in ("small", "large"):
                databases.use(which)
                row[f"{which}_items"] = len(ask().json()["items"])
            # A first page the small database cannot fill holds fewer runs there: the same list with `limit` set to
            # what it held compares pages of one size, which tells the table's size from the page's.
            if 0 < row["small_items"] < row["large_items"] and "limit=" not in path:
                limit = row["small_items"]
                todo.insert(0, (f"{label}, limit={limit}", f"{path}{'&' if '?' in path else '?'}limit={limit}"))
        rows.append(row)
    times = _timed(lambda: sweep_once(who="bench-j"), databases, requests=requests, warmup=warmup)
    rows.append(
        {"surface": "sweep (`sweep_once()`, nothing stuck)", "path": "runs.recovery.sweep_once", "times": times}
    )
    for row in rows:
        small, large = (common.median(row["times"][w]) for w in ("small", "large"))
        row.update({"small_ms": round(small, 3), "large_ms": round(large, 3), "ratio": round(large / small, 3)})
        row["times"] = {w: [round(t, 2) for t in ts] for w, ts in row["times"].items()}
    return rows


def _clone(source: str, target: str) -> None:
    """CREATE DATABASE target TEMPLATE source (no one may be connected to source meanwhile)."""
    from django.db import connections
    from psycopg import sql

    connections.close_all()
    with common._pg_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(target), sql.Identifier(source)))


def flat_at_scale(small: int, large: int, requests: int, warmup: int) -> dict:
    """J: `small` finished runs are made in the fresh database, which is then copied (CREATE DATABASE ... TEMPLATE)
    and the copy grown to `large`; every surface is then timed on both, request by request in turn. values: the
    ratios (median on the large one ÷ median on the small one), one per surface."""
    _setup(PAL_LOG_LEVEL="WARNING")
    from django.db import connection
    from django.test import Client

    ctx = _prepare()
    login = Client(HTTP_HOST="127.0.0.1")
    login.force_login(ctx["user"])  # the session row is copied with the database
    ctx["cookies"] = login.cookies
    window = (_days_ago(10), _days_ago(9))
    fills = {"small": fill(start=0, stop=small, common_ids=ctx["common"], rare=ctx["rare"])}
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM runs ORDER BY created_at DESC LIMIT 1")
        parent = str(cursor.fetchone()[0])
    from runs.selectors import run_list

    # Page 2 from the small database's first page: the cursor names a run that both databases hold.
    cursor_query = urlencode({"limit": 50, "cursor": run_list(limit=50)[1]})
    ctx["surfaces"] = [
        (label, f"/api/v1/runs?{cursor_query}" if path == "CURSOR" else path)
        for label, path in surfaces(window=window, parent=parent, views=ctx["views"])
    ]
    small_db = connection.settings_dict["NAME"]
    large_db = f"{small_db}_large"
    _clone(small_db, large_db)
    databases = _Databases(small_db, large_db)
    try:
        databases.use("large")
        fills["large"] = fill(start=small, stop=large, common_ids=ctx["common"], rare=ctx["rare"])
        sizes = {}
        for which in ("small", "large"):
            databases.use(which)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM journal_events), "
                    "pg_size_pretty(pg_total_relation_size('runs')), "
                    "pg_size_pretty(pg_total_relation_size('journal_events'))"
                )
                sizes[which] = dict(
                    zip(("runs", "events", "runs_size", "journal_size"), cursor.fetchone(), strict=True)
                )
        rows = measure(ctx, databases, requests=requests, warmup=warmup)
    finally:
        databases.close()
        common.pg_drop(large_db)
    for row in rows:
        print(f"{row['surface']}: {row['small_ms']:.2f} ms -> {row['large_ms']:.2f} ms ({row['ratio']:.2f}x)")
    details = {
        "rows": rows,
        "small": small,
        "large": large,
        "sizes": sizes,
        "fill_seconds": {k: round(v, 1) for k, v in fills.items()},
        "requests": requests,
        "warmup": warmup,
    }
    print(json.dumps({k: v for k, v in details.items() if k != "rows"}))
    return {"values": [r["ratio"] for r in rows], "details": details}


# --- the report (bench.report calls these) ---------------------------------------------------------

AIM = 1.5
HOW = (
    "the fresh database gets {small:,} finished runs (INSERT ... SELECT generate_series, each with 4 journal events), "
    "is copied (CREATE DATABASE ... TEMPLATE) and the copy grown to {large:,}; both VACUUM ANALYZEd. Every page "
    "and list is asked through Django's test client in the bench process (the whole Django stack: middleware, "
    "views, templates; no HTTP server), {warmup} warm-up requests and then {requests} on each database in turn "
    "(1,000, 1,000,000, 1,000, ...: a burst of load from elsewhere falls on both); the sweep is "
    "`runs.recovery.sweep_once()` called the same way. Each rare value (a workflow, an error code, a customer) is "
    "held by 60 runs of each fill, so a rare filter's first page is full on both databases while the value is 6 % "
    "of the small one and 0.012 % of the large. A filter whose first page the small database cannot fill (a share "
    "of 1,000 below 50 runs) gets, for the API, a row `limit=N` after it with the page cut to the small database's "
    "N runs on both, which compares pages of one size. Each run has the attributes customer (its input's) and tier "
    "(gold 40 %); the user's three saved views are a rare customer's, gold failed and gold (bench/flat.py)"
)


def summary_line(r: dict) -> str:
    rows = r["details"][-1]["rows"]
    over = [row for row in rows if row["ratio"] > AIM]
    worst = max(rows, key=lambda row: row["ratio"])
    return (
        f"{len(rows) - len(over)}/{len(rows)} surfaces within {AIM}x; worst {worst['surface']} "
        f"{worst['small_ms']:.1f} -> {worst['large_ms']:.1f} ms ({worst['ratio']:.2f}x) ({r['wall_seconds']} s)"
    )


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def report_section(results: list[dict], plan: dict) -> list[str]:
    """The section of docs/PERFORMANCE.md: one row per surface, the two medians and their ratio."""
    j = plan["J"]
    small, large = j["small"], j["large"]
    out = [
        f"## J. Flat at scale: every page and list with {small:,} and with {large:,} finished runs (PAL Ops only)",
        "",
        f"Median milliseconds per request over {j['requests']} requests on each database (lower is better); the ratio "
        f"is the median at {large:,} ÷ the median at {small:,}. Aim (issue 15 section 4, issue 13): ≤ {AIM}×.",
        "",
    ]
    r = next((r for r in results if r["scenario"] == "J"), None)
    if r is None:
        return [*out, "Not run this time (`--scenarios`/`--sides`).", ""]
    if r["status"] != "ok":
        return [*out, f"{r['status']}: {r.get('message', '')[:300]} (log {r.get('log')})", ""]
    d = r["details"][-1]
    rows = d["rows"]
    over = [row for row in rows if row["ratio"] > AIM]
    verdict = f"{len(rows) - len(over)} of {len(rows)} surfaces within {AIM}×"
    if over:
        verdict += "; over it: " + ", ".join(f"{row['surface']} ({row['ratio']:.2f}×)" for row in over)
    out += [
        verdict + ".",
        "",
        f"| surface | request | median ms at {small:,} | median ms at {large:,} | ratio | runs on the first page |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        items = f"{row['small_items']} / {row['large_items']}" if "small_items" in row else ""
        mark = "" if row["ratio"] <= AIM else " ✗"
        path = row["path"] if len(row["path"]) <= 90 else row["path"][:87] + "…"
        out.append(
            f"| {row['surface']} | `{path}` | {_ms(row['small_ms'])} | {_ms(row['large_ms'])} | "
            f"{row['ratio']:.2f}×{mark} | {items} |"
        )
    sizes = d.get("sizes", {})
    out += [""]
    if sizes:
        out.append(
            "Databases: "
            + "; ".join(
                f"{s['runs']:,} runs ({s['runs_size']}), {s['events']:,} journal events ({s['journal_size']})"
                for s in (sizes["small"], sizes["large"])
            )
            + f". Fill: {d['fill_seconds']['small']} s and {d['fill_seconds']['large']} s (VACUUM ANALYZE included). "
            f"Load (1 min) when it began: {', '.join(f'{x:.1f}' for x in r.get('loadavg', []))}; the job took "
            f"{r['wall_seconds']} s."
        )
        out.append("")
    out += ["How it was measured: " + HOW.format(**j) + ".", ""]
    return out

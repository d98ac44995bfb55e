"""Benchmark (not a test): what the ops dashboard's counts cost with 20 live runs, then with 1,000,000 finished.

    DATABASE_URL=postgres://pal:pal@127.0.0.1:5432/pal_scratch .venv/bin/python -m tests.pages.bench_ops_counts

It writes into the database DATABASE_URL names (migrated; use a scratch one: it adds a workflow, 20 live runs and
1,000,000 finished runs by one INSERT ... SELECT generate_series, then VACUUM ANALYZE, what autovacuum would do).
It times, median and best of 7 after one warm-up: the old count (every run, GROUP BY status), the dashboard's
count now (runs.selectors.status_counts) and the whole counts fragment (GET /ops/ as htmx polls it, through
Django's test client). It prints a table; nothing asserts a time.
"""

import os
import statistics
import sys
import time

REPEAT = 7
FINISHED = 1_000_000


def timed(fn) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), min(samples)


def seed(cursor, *, finished: int) -> None:
    cursor.execute("SELECT id FROM workflows WHERE name = 'bench-ops'")
    row = cursor.fetchone()
    if row is None:
        cursor.execute(
            "INSERT INTO workflows (name, version, description, definition, created_at) VALUES "
            "('bench-ops', 1, '', '{\"name\": \"bench-ops\", \"steps\": []}', now()) RETURNING id"
        )
        row = cursor.fetchone()
    columns = (
        "id, status, input, depth, trigger_meta, request_hash, created_by, created_at, updated_at, "
        "workflow_id, journal_head_hash, finished_at"
    )
    if not finished:  # a fresh start: the runs of an earlier go are deleted, 20 live ones made
        cursor.execute("DELETE FROM runs WHERE workflow_id = %s", [row[0]])
        cursor.execute(
            f"INSERT INTO runs ({columns}) SELECT gen_random_uuid(), "
            "(ARRAY['queued', 'running', 'waiting'])[1 + mod(g, 3)], '{}', 0, '{}', '', 'bench', "
            "now() - g * interval '1 second', now(), %s, '', NULL FROM generate_series(1, 20) g",
            [row[0]],
        )
    else:
        # 92 % succeeded, 6 % failed, 2 % cancelled, over the last 30 days.
        cursor.execute(
            f"INSERT INTO runs ({columns}) SELECT gen_random_uuid(), CASE WHEN mod(g, 50) = 0 THEN "
            "'cancelled' WHEN mod(g, 25) = 0 OR mod(g, 50) IN (1, 2) THEN 'failed' ELSE 'succeeded' END, "
            "'{}', 0, '{}', '', 'bench', now() - mod(g, 2592000) * interval '1 second', now(), %s, '', now() "
            "FROM generate_series(1, %s) g",
            [row[0], finished],
        )
    cursor.execute("VACUUM ANALYZE runs")


def measure(label: str, client) -> list[str]:
    from django.db import connection
    from django.db.models import Count

    from runs.models import Run
    from runs.selectors import status_counts

    old = timed(lambda: list(Run.objects.order_by().values("status").annotate(n=Count("id"))))
    new = timed(status_counts)
    page = timed(lambda: client.get("/ops/", headers={"HX-Request": "true", "HX-Target": "ops-counts"}))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM runs")
        total = cursor.fetchone()[0]
    shown = {s: c["shown"] for s, c in status_counts().items()}
    return [
        f"| {label} | {total:,} | {old[0]:.2f} ms ({old[1]:.2f}) | {new[0]:.2f} ms ({new[1]:.2f}) | "
        f"{page[0]:.1f} ms ({page[1]:.1f}) |",
        f"  shown: {shown}",
    ]


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-insecure-key")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    if connection.vendor != "postgresql":
        sys.exit("this benchmark needs Postgres (DATABASE_URL=postgres://...)")
    setup_test_environment()
    settings.ALLOWED_HOSTS = ["testserver"]
    user, _ = get_user_model().objects.get_or_create(username="bench-ops", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    lines = [
        "| runs | rows | old count (GROUP BY) median (best) | status_counts median (best) | "
        "counts fragment median (best) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    with connection.cursor() as cursor:
        seed(cursor, finished=0)
    lines += measure("20 live", client)
    with connection.cursor() as cursor:
        seed(cursor, finished=FINISHED)
    lines += measure(f"20 live + {FINISHED:,} finished", client)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

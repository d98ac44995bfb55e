"""GET /health: the database, the broker and the sweep, each with what it found."""

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from pal import db_away
from pal.celery import app

from ..models import (
    Sweep,
)

# The workers' side of /health: beat sends a sweep every PAL_RECOVERY_INTERVAL and a worker runs it, so a last
# sweep older than a few intervals means no beat, no worker, or workers that cannot reach the database.
SWEEP_STALE_INTERVALS = 3
SWEEP_STALE_MARGIN_SECONDS = 10.0


def health() -> dict[str, Any]:
    """{database, broker, sweep, last_sweep_at, problems}: "ok" or what is wrong with each, and a sentence per
    problem. sweep is "ok", "stale" (older than SWEEP_STALE_INTERVALS intervals plus a margin), "none" (no sweep
    has finished yet: a new installation, nothing to judge by) or "unknown" (the database does not answer)."""
    problems = []
    database = "ok"
    sweep = "unknown"
    last_sweep_at = None
    try:
        last_sweep_at = _database_check()
    except Exception as exc:  # any failure means the same: the database does not answer
        database = "error"
        problems.append(f"database: {type(exc).__name__}: {exc}")
    else:
        sweep, problem = _sweep_check(last_sweep_at)
        if problem:
            problems.append(problem)
    broker = "ok"
    try:
        _broker_ping()
    except Exception as exc:
        broker = "error"
        problems.append(f"broker: {type(exc).__name__}: {exc}")
    return {
        "database": database,
        "broker": broker,
        "sweep": sweep,
        "last_sweep_at": last_sweep_at,
        "problems": problems,
    }


class DatabaseAway(Exception):
    """The web process knows the database is away (pal.db_away): /health says so without waiting on the pool."""


def _database_check() -> datetime | None:
    """A round trip on a connection known to be alive; returns when the last sweep finished."""
    why = db_away.database_away()
    if why:
        raise DatabaseAway(why)
    if not connection.in_atomic_block:
        # A kept connection may have died with a Postgres restart: health-check it (or replace it) first, so the
        # answer is the database's now, never an error of a stale connection (nor an "ok" remembered from before).
        connection.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return (
        Sweep.objects.filter(finished_at__isnull=False)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )


def _sweep_check(last_sweep_at: datetime | None) -> tuple[str, str | None]:
    if last_sweep_at is None:
        return "none", None
    interval = settings.PAL_RECOVERY_INTERVAL
    limit = SWEEP_STALE_INTERVALS * interval + SWEEP_STALE_MARGIN_SECONDS
    age = (timezone.now() - last_sweep_at).total_seconds()
    if age <= limit:
        return "ok", None
    return "stale", (
        f"sweep: the last recovery sweep finished {age:.0f}s ago (PAL_RECOVERY_INTERVAL is "
        f"{interval:g}s, stale after {limit:g}s): is celery beat running, and do the workers reach "
        f"the database?"
    )


def _broker_ping(timeout: float = 2.0) -> None:
    with app.connection_for_write(settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        if conn.transport.driver_type == "redis":
            conn.default_channel.client.ping()

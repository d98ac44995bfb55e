"""One clock for the engine: the database's."""

# Hosts' clocks disagree (a worker 40 s ahead, the beat behind): every comparison with a lease's expiry, a timer's
# wake time, a rate-limit window or a fire time is made against the database's clock, never a process's own. On
# Postgres that is statement_timestamp() inside the statement (no round trip of its own); SQLite, the embedded
# default, lives on one machine, whose clock is the only one. Timestamps merely recorded (a journal row's created_at)
# may use the local clock.

from datetime import datetime, timedelta

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

# statement_timestamp(), not now(): the same inside a transaction as outside it (now() is the transaction's start,
# so a retry loop inside one would never see a lease expire). Django's Now() compiles to it too.
SQL_NOW = "statement_timestamp()"


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def db_now() -> datetime:
    """The database's clock as a value (one round trip on Postgres): for a comparison made in Python, off the hot
    path (a page, a timer's start)."""
    if not _postgres():
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SQL_NOW}")
        return cursor.fetchone()[0]


def db_clock(seconds: float = 0.0):
    """The database's clock (+ seconds) for an ORM filter, update or annotation: an expression evaluated in the
    statement on Postgres, the local clock's value on SQLite."""
    if not _postgres():
        return timezone.now() + timedelta(seconds=seconds)
    return Now() + timedelta(seconds=seconds) if seconds else Now()


def db_clock_sql(seconds: float | None = None) -> tuple[str, list]:
    """The same for raw SQL: (fragment, params). seconds None: the clock itself; else the clock plus that many
    seconds (a parameter, so the statement's text stays the same)."""
    if not _postgres():
        return "%s", [timezone.now() + timedelta(seconds=seconds or 0.0)]
    if seconds is None:
        return SQL_NOW, []
    return f"({SQL_NOW} + %s * interval '1 second')", [float(seconds)]

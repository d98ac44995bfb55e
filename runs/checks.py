"""System checks that reach the network (`manage.py check --database default`, or `--tag pal`): the broker answers
(pal.W010) and the migrations of runs and journal are applied (pal.W011). Plain `manage.py check` stays offline,
as Django leaves its own database-tagged checks out of it; the TASKS settings are checked there (pal.tasks)."""

from celery import current_app
from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from kombu.utils.url import maybe_sanitize_url

from .secrets import mask

APPS = ("runs", "journal")
BROKER_TIMEOUT = 3.0  # seconds a check waits for the broker


@checks.register(checks.Tags.database, "pal")
def broker_check(app_configs=None, **kwargs):
    """pal.W010: the Celery broker (CELERY_BROKER_URL) accepts a connection."""
    url = settings.CELERY_BROKER_URL
    try:
        with current_app.connection_for_write(url, connect_timeout=BROKER_TIMEOUT) as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT)
    except Exception as exc:
        return [
            checks.Warning(
                f"the broker {maybe_sanitize_url(url)} does not answer ({type(exc).__name__}: {mask(str(exc))})",
                hint="Start the broker, or set CELERY_BROKER_URL to one that runs: without it no run is driven.",
                id="pal.W010",
            )
        ]
    return []


@checks.register(checks.Tags.database, "pal")
def migrations_check(app_configs=None, databases=None, **kwargs):
    """pal.W011: every migration of runs and journal is applied to each database checked."""
    errors = []
    for alias in databases or ["default"]:
        try:
            executor = MigrationExecutor(connections[alias])
            targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] in APPS]
            missing = [f"{migration.app_label}.{migration.name}" for migration, _ in executor.migration_plan(targets)]
        except DatabaseError as exc:
            errors.append(
                checks.Warning(
                    f"database {alias!r} does not answer ({type(exc).__name__}: {mask(str(exc).strip())})",
                    hint="Start the database, or set DATABASE_URL to one that runs.",
                    id="pal.W012",
                )
            )
            continue
        if missing:
            errors.append(
                checks.Warning(
                    f"database {alias!r}: {len(missing)} migration(s) not applied: {', '.join(missing[:5])}"
                    + (", ..." if len(missing) > 5 else ""),
                    hint="Run `python manage.py migrate` before starting the web, the workers and the beat.",
                    id="pal.W011",
                )
            )
    return errors

"""The Celery app: autodiscovered tasks and the beat schedule of the recovery sweep."""

import os

from celery import Celery
from celery.signals import task_prerun
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")

app = Celery("pal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _no_dead_database_connection(sender=None, **kwargs):
    """Before each task, what Django does before each request: a kept connection that errored, outlived
    CONN_MAX_AGE or fails its health check (CONN_HEALTH_CHECKS, one `SELECT 1` at its first use in the task) is
    replaced. CELERY_DB_REUSE_MAX keeps Celery's fix-up from closing connections at every task, which also means it
    would notice a dead one (after a Postgres restart or failover) only every 2,000 tasks; until then every task
    of the worker would fail on it."""
    if getattr(sender.request, "is_eager", False):
        return  # run inline by the caller, inside the caller's transaction: its connection is not ours to close
    close_old_connections()

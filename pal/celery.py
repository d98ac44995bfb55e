"""The Celery app: autodiscovered tasks and the beat schedule of the recovery sweep (the beat's scheduler: pal.beat)."""

import os

from celery import Celery
from celery.signals import task_prerun, worker_init, worker_process_init, worker_process_shutdown
from django.db import close_old_connections

from pal import telemetry  # a library module: it imports no app, so it loads before Django is set up

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


@worker_process_init.connect
def _tracing_in_each_child(**kwargs):
    """Traces (pal.telemetry, only with OTEL_EXPORTER_OTLP_ENDPOINT): set up in each prefork child, after the fork,
    so the exporter's thread and the instrumentation live in the process that runs the tasks."""
    telemetry.tracing_setup("pal-worker")


@worker_init.connect
def _tracing_without_children(sender=None, **kwargs):
    """The solo and thread pools run tasks in the worker's own process: set up there."""
    if "prefork" not in str(getattr(sender, "pool_cls", "prefork")).lower():
        telemetry.tracing_setup("pal-worker")


@worker_process_shutdown.connect
def _flush_on_exit(pid=None, **kwargs):
    """A child leaving: export its buffered spans, and let the metrics of a live gauge forget it (pal.meters)."""
    telemetry.tracing_shutdown()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess  # multiprocess mode only

        multiprocess.mark_process_dead(pid or os.getpid())

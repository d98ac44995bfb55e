"""`celery -A bench.idle_app worker`: PAL Ops' own Celery app (pal.celery), in a worker process that counts the
statements it sends to the database, for scenario C's idle fleet (bench.ours.idle_fleet_queries).

After each task the process writes "<statements> <tasks>" so far to $BENCH_STATEMENTS_DIR/<pid>; the bench reads
every process's file at the start and at the end of its window. Counted: every statement through Django's
cursors (the ORM's and raw ones, savepoints included); not counted: the one `SELECT 1` health check a task's first
use of its connection makes (CONN_HEALTH_CHECKS), which is why the tasks are counted too.
"""

import os
from pathlib import Path

from celery.signals import task_postrun
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from pal.celery import app

__all__ = ["app"]

_counts = {"statements": 0, "tasks": 0}


def _count(execute, sql, params, many, context):
    _counts["statements"] += 1
    return execute(sql, params, many, context)


@receiver(connection_created)
def _counted(sender, connection, **kwargs):
    if _count not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count)


@task_postrun.connect
def _write_counts(**kwargs):
    _counts["tasks"] += 1
    folder = Path(os.environ["BENCH_STATEMENTS_DIR"])
    path = folder / str(os.getpid())
    partial = folder / f".{os.getpid()}.tmp"
    partial.write_text(f"{_counts['statements']} {_counts['tasks']}")
    partial.replace(path)  # a reader sees the old count or the new one, never half a file

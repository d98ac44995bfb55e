"""Tasks of Django's task framework that the tests enqueue (imported by the test process and by the workers)."""

import os
import time
from pathlib import Path

from django.tasks import TaskResultStatus, task
from django.tasks.signals import task_finished, task_started

# In a worker started with PAL_TEST_SIGNAL_DIR, each task signal leaves a file there (the test reads them).
SIGNALS = os.environ.get("PAL_TEST_SIGNAL_DIR")


def _note(what):
    def receiver(sender, task_result, **kwargs):
        name = f"{what}-{task_result.id}-{task_result.status}-{time.monotonic_ns()}"
        succeeded = task_result.status == TaskResultStatus.SUCCESSFUL
        Path(SIGNALS, name).write_text(repr(task_result.return_value) if succeeded else "None")

    return receiver


if SIGNALS:
    task_started.connect(_note("started"), weak=False)
    task_finished.connect(_note("finished"), weak=False)


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def refuse(reason: str) -> None:
    raise ValueError(f"refused: {reason}")


@task(takes_context=True)
def charge(context, marker_dir: str, seconds: float) -> dict:
    """Notes each call with the key it was given (a provider would deduplicate on it), then takes a while."""
    Path(marker_dir, f"call-{os.getpid()}-{time.monotonic_ns()}").write_text(context.idempotency_key)
    time.sleep(seconds)
    return {"charged": True, "key": context.idempotency_key, "run": context.result_id}

"""Tasks of Django's task framework that the tests enqueue (imported by the test process and by the workers)."""

import json
import os
import signal
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
        Path(SIGNALS, name).write_text(json.dumps(task_result.return_value if succeeded else None))

    return receiver


if SIGNALS:
    task_started.connect(_note("started"), weak=False)
    task_finished.connect(_note("finished"), weak=False)

# In a worker started with PAL_TEST_KILL_DIR and PAL_TEST_KILL_AT, the worker kills itself (kill -9 of its process
# group, as a machine dies) once per run, at that point of a task's step: "after task_called" (its row committed,
# task_started not sent yet) or "before the outcome" (the task's call returned, its step_completed not committed).
KILL_DIR, KILL_AT = os.environ.get("PAL_TEST_KILL_DIR"), os.environ.get("PAL_TEST_KILL_AT")


def _die_once(run_id) -> None:
    try:
        open(os.path.join(KILL_DIR or "", f"killed-{run_id}"), "x").close()
    except FileExistsError:
        return
    os.killpg(os.getpgrp(), signal.SIGKILL)


if KILL_DIR and KILL_AT:
    from runs.walk.writer import JournalWriter

    _write = JournalWriter._write

    def _dying_write(self, events, *, fenced):
        kinds = {event.kind for event in events if event.step_id == "task"}
        if KILL_AT == "before the outcome" and kinds & {"step_completed", "step_failed"}:
            _die_once(self.run.id)
        written = _write(self, events, fenced=fenced)
        if KILL_AT == "after task_called" and "task_called" in kinds:
            _die_once(self.run.id)
        return written

    JournalWriter._write = _dying_write  # type: ignore[method-assign]


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

"""django_task: a task of Django's task framework (a @task function, by its dotted path) run as a step.

{"kind": "django_task", "task": "app.tasks.fn", "args": {"args": [...], "kwargs": {...}, "run_after": ISO}}
The return value is the output; an exception fails the step with code task_error (its class and traceback in
details); run_after waits on a durable timer; a task with takes_context gets the attempt's idempotency key."""

import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.dispatch import Signal
from django.tasks import Task
from django.utils.dateparse import parse_datetime
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from journal.selectors import events_of_kind
from pal.clock import db_now

from ..errors import StepError, Wait
from .base import StepKind, log, register, run_masked

# What pal.tasks turns into django.tasks' task_started / task_finished, each sent from the committed journal by the
# worker that committed it. started(run_id) after the run's first task_called is journaled, before the call; a
# receiver that sent it answers True and the step journals task_signal_sent, so a re-drive of a step killed between
# the two sends it (once) and one killed later does not. ended(run_id) after a task run's end commits (Walk.finish):
# a run ends once, so it is sent once, never for a call whose outcome a crash kept from the journal.
started = Signal()
ended = Signal()
SENT = "task_signal_sent"


def _send(signal: Signal, **fields) -> bool:
    """Whether a receiver answered True (it sent django.tasks' signal); a receiver's failure is logged, never the
    task's."""
    answers = signal.send_robust(DjangoTask, **fields)
    for receiver, answer in answers:
        if isinstance(answer, Exception):
            log.error("receiver %r of a django_task signal raised %s: %s", receiver, type(answer).__name__, answer)
    return any(answer is True for _, answer in answers)


def task_run_ended(*, run_id) -> None:
    """After the commit of the end of a run of a task: workflow (runs.walk): django.tasks' task_finished."""
    _send(ended, run_id=run_id)


@dataclass(frozen=True)
class PalTaskContext:
    """What a task with takes_context=True gets: its run (result_id, for get_result), the step's attempt and the
    attempt's idempotency key, the same on every re-drive of that attempt (hand it to a provider)."""

    result_id: str
    attempt: int
    idempotency_key: str


def task_at(path: str) -> Task:
    """The Task a dotted path names; StepError(unknown_task) when it names none."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise StepError(f"no task {path!r}: {exc}", code="unknown_task") from None
    if not isinstance(found, Task):
        raise StepError(f"{path!r} is not a task (a function decorated with django.tasks.task)", code="unknown_task")
    return found


@register
class DjangoTask(StepKind):
    kind = "django_task"
    required = ("task",)
    optional = ("args",)
    templated = ("args",)

    def validate(self, step):
        errors = []
        if not isinstance(step.get("task"), str) or "." not in step.get("task", ""):
            errors.append(("task", "must be the dotted path of a task, e.g. billing.tasks.charge"))
        args = step.get("args", {})
        if not isinstance(args, (dict, str)):
            errors.append(("args", 'must be an object {"args": [...], "kwargs": {...}} or a template'))
        return errors

    def run(self, step, ctx):
        fields = step.get("args") or {}
        if not isinstance(fields, dict):
            raise StepError("args must render to an object", code="bad_args")
        wait = self._run_after(fields.get("run_after"), ctx)
        if wait is not None:
            raise wait
        task = task_at(step["task"])
        args, kwargs = fields.get("args") or [], fields.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise StepError("args.args must be a list and args.kwargs an object", code="bad_args")

        def call(_fields, context):
            context.emit("task_called", {"task": step["task"]})  # when it really ran, and on which worker
            if not events_of_kind(run_id=context.run_id, kind=SENT, step_ids=[context.step_id]):
                if _send(started, run_id=context.run_id):
                    context.emit(SENT, {"signal": "task_started"})
            try:
                if task.takes_context:
                    task_context = PalTaskContext(context.run_id, context.attempt, context.key)
                    value = task.call(task_context, *args, **kwargs)
                else:
                    value = task.call(*args, **kwargs)
            except StepError:
                raise
            except Exception as exc:
                kind = type(exc)
                raise StepError(
                    f"{kind.__name__}: {exc}",
                    code="task_error",
                    details={
                        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
                        "traceback": "".join(traceback.format_exception(exc)),
                    },
                ) from None
            return normalize_json(value)

        return run_masked(call, step, ctx)

    @staticmethod
    def _run_after(raw: Any, ctx) -> Wait | None:
        """A Wait on a durable timer until run_after (by the database's clock), or None once it has passed."""
        if not raw:
            return None
        until = parse_datetime(raw) if isinstance(raw, str) else None
        if until is None:
            raise StepError(f"run_after must be an ISO 8601 time, got {raw!r}", code="bad_args")
        if db_now() >= until - timedelta(milliseconds=1):
            return None
        return Wait(
            {"kind": "timer", "step_id": ctx.step_id, "attempt": ctx.attempt, "until": until.isoformat()}, wake_at=until
        )

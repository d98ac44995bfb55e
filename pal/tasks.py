"""Django's task framework on PAL Ops: TASKS = {"default": {"BACKEND": "pal.tasks.PalBackend"}}.

enqueue() makes a durable run of workflow task:<module>.<function> (one django_task step, the arguments its input,
the task's priority its priority) in the caller's transaction, so a rolled-back atomic() makes no run; get_result(run
id) reads it: queued / waiting -> READY, running -> RUNNING, succeeded -> SUCCESSFUL, failed / cancelled -> FAILED."""

import logging

from django.apps import apps
from django.core import checks
from django.core.exceptions import ValidationError
from django.db import transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError, TaskResult
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from journal.selectors import events_for_run
from runs.errors import NotFound
from runs.models import Run
from runs.services import run_create, workflow_create
from runs.steps import django_task
from runs.steps.base import TASK_WORKFLOW_RE
from runs.workflows import WorkflowInvalid

log = logging.getLogger("pal.tasks")

STATUSES = {
    "queued": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def task_path(task) -> str:
    return f"{task.func.__module__}.{task.func.__qualname__}"


def definition_for(path: str) -> dict:
    """The one-step workflow a task runs as."""
    return {
        "name": f"task:{path}",
        "description": f"Django task {path}",
        "steps": [{"id": "task", "kind": "django_task", "task": path, "args": "{{ input }}"}],
    }


class PalBackend(BaseTaskBackend):
    supports_defer = True  # run_after: a durable timer of the run's step
    supports_get_result = True
    supports_priority = True  # the run's priority (runs.dispatch.broker_priority, concurrency slots, paced resumes)

    def check(self, **kwargs):
        """System checks of this TASKS entry (`manage.py check`, offline): pal.E001 to pal.E003."""
        where = f"TASKS[{self.alias!r}]"
        if self.options:
            yield checks.Error(
                f"{where}: PalBackend takes no OPTIONS (got {', '.join(sorted(map(str, self.options)))})",
                hint="Remove OPTIONS: a run's retries, timeouts and limits are its workflow's.",
                id="pal.E001",
            )
        if self.queues != {DEFAULT_TASK_QUEUE_NAME}:
            yield checks.Error(
                f"{where}: QUEUES names {', '.join(sorted(self.queues - {DEFAULT_TASK_QUEUE_NAME})) or 'no queue'};"
                f" PalBackend has one queue, {DEFAULT_TASK_QUEUE_NAME!r}",
                hint="Remove QUEUES: every run is driven from the Celery workers' queue, whatever its queue_name.",
                id="pal.E002",
            )
        if not apps.is_installed("runs") or not apps.is_installed("journal"):
            yield checks.Error(
                f"{where}: PalBackend needs the apps runs and journal in INSTALLED_APPS",
                hint="Add 'runs' and 'journal' to INSTALLED_APPS (a task is a run, its record the run's journal).",
                id="pal.E003",
            )

    def validate_task(self, task):
        super().validate_task(task)
        if not TASK_WORKFLOW_RE.match(f"task:{task_path(task)}"):
            raise InvalidTask(f"task:{task_path(task)} is not a workflow name (letters, digits, _ and ., <= 64)")

    def enqueue(self, task, args, kwargs):
        self.validate_task(task)
        path = task_path(task)
        name = f"task:{path}"
        input = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        if task.run_after is not None:
            input["run_after"] = task.run_after.isoformat()
        made_by = f"django.tasks {self.alias}"
        try:
            run, _ = run_create(workflow_name=name, input=input, created_by=made_by, priority=task.priority)
        except NotFound as exc:  # the task's first enqueue: store its one-step workflow, then make the run
            if exc.code != "workflow_not_found":
                raise
            try:
                workflow_create(definition=definition_for(path))
            except WorkflowInvalid as exc:
                raise InvalidTask(f"{name}: {exc}") from None
            run, _ = run_create(workflow_name=name, input=input, created_by=made_by, priority=task.priority)
        result = self._result(task, run, events=[])
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result))
        return result

    def get_result(self, result_id):
        try:
            run = Run.objects.select_related("workflow").get(id=result_id)
        except (Run.DoesNotExist, ValidationError, ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        if not run.workflow.name.startswith("task:"):
            raise TaskResultDoesNotExist(result_id)
        task = import_string(run.workflow.name.removeprefix("task:"))
        if task.priority != run.priority:  # enqueued with task.using(priority=...)
            task = task.using(priority=run.priority)
        return self._result(task, run, events=list(events_for_run(run_id=run.id)))

    def _result(self, task, run: Run, *, events: list) -> TaskResult:
        started = [e for e in events if e.kind == "task_called"]  # each call of the task (a re-drive calls again)
        ended = next((e for e in reversed(events) if e.kind in ("run_succeeded", "run_failed", "run_cancelled")), None)
        errors = [
            TaskError(
                exception_class_path=(e.payload.get("details") or {}).get("exception_class_path", "builtins.Exception"),
                traceback=(e.payload.get("details") or {}).get("traceback", e.payload.get("message", "")),
            )
            for e in events
            if e.kind == "step_failed"
        ]
        result: TaskResult = TaskResult(
            task=task,
            id=str(run.id),
            status=STATUSES[run.status],
            enqueued_at=run.created_at,
            started_at=started[0].created_at if started else None,
            last_attempted_at=started[-1].created_at if started else None,
            finished_at=ended.created_at if ended else None,
            args=run.input.get("args", []),
            kwargs=run.input.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[e.writer for e in started],
        )
        if run.status == "succeeded":
            object.__setattr__(result, "_return_value", run.output)
        return result


def _started(sender, run_id, **kwargs) -> bool:
    """django.tasks' task_started, before the task's first call (runs.steps.django_task sends it once from the
    journal); True when sent, False for a django_task step of a workflow that is no enqueued task."""
    try:
        result = PalBackend("default", {}).get_result(run_id)
    except TaskResultDoesNotExist:
        return False
    _send_robust(task_started, result)
    return True


def _finished(sender, run_id, **kwargs) -> bool:
    """django.tasks' task_finished, once the task's run has ended (after that commit): its result as get_result
    reads it (SUCCESSFUL with return_value, or FAILED with errors)."""
    try:
        result = PalBackend("default", {}).get_result(run_id)
    except TaskResultDoesNotExist:
        return False
    _send_robust(task_finished, result)
    return True


def _send_robust(signal, result: TaskResult) -> None:
    """A receiver that raises is logged, as Django's own backends log it; the others still get the signal."""
    for receiver, answer in signal.send_robust(PalBackend, task_result=result):
        if isinstance(answer, Exception):
            log.error("a receiver of %s, %r, raised %s: %s", signal, receiver, type(answer).__name__, answer)


django_task.started.connect(_started, dispatch_uid="pal.tasks.started")
django_task.ended.connect(_finished, dispatch_uid="pal.tasks.finished")

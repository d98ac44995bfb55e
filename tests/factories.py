"""Build workflows and runs in one line, drive them inline, and a few tools that tests need.

Plain functions, not fixtures, so any test module can import them. The tools are registered on import
and record what they saw per run id, so tests never share state through them.
"""

import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
from django.core.mail.backends import locmem
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection
from django.utils import timezone

from journal.models import JournalEvent
from journal.services import NewEvent, events_append
from runs import leases
from runs.errors import StepError
from runs.models import FINAL_STATUSES, Run, RunLock, RunStatus
from runs.services import run_cancel, run_create, workflow_create
from runs.steps.tools import tool
from runs.walk import run_drive

# --- tools --------------------------------------------------------------------------------------------

CALLS: dict[str, list[dict]] = defaultdict(list)  # run_id -> what each call of a test tool saw
_done_once: set[tuple[str, str]] = set()  # (run_id, step_id) whose one-time behaviour already happened


class Crash(BaseException):
    """Stands for the process dying mid-step: not an Exception, so the executor does not catch it."""


def _record(args, ctx):
    CALLS[ctx.run_id].append(
        {"step_id": ctx.step_id, "attempt": ctx.attempt, "key": ctx.key, "resumed": ctx.resumed, "args": args}
    )


def _first_time(ctx) -> bool:
    mark = (ctx.run_id, ctx.step_id)
    if mark in _done_once:
        return False
    _done_once.add(mark)
    return True


@tool("test_count")
def count_tool(args, ctx):
    """Returns its args, like echo, and records the call."""
    _record(args, ctx)
    return args


@tool("test_fail")
def fail_tool(args, ctx):
    """Always fails definitely."""
    _record(args, ctx)
    raise StepError("the test tool refuses", code="test_refused")


@tool("test_fail_before")
def fail_before_tool(args, ctx):
    """Fails definitely until attempt args["succeed_on"], then returns its args."""
    _record(args, ctx)
    if ctx.attempt < args["succeed_on"]:
        raise StepError(f"not yet (attempt {ctx.attempt})", code="test_refused")
    return args


@tool("test_unknown_once")
def unknown_once_tool(args, ctx):
    """The first call's outcome is unknown (say, the connection dropped after sending); then it works."""
    _record(args, ctx)
    if _first_time(ctx):
        raise StepError("connection lost after sending", permanent=False, code="test_unavailable")
    return args


@tool("test_boom")
def boom_tool(args, ctx):
    """A tool with a bug: raises an exception the executor did not expect."""
    _record(args, ctx)
    raise ZeroDivisionError("division by zero in a tool")


@tool("test_crash_once")
def crash_once_tool(args, ctx):
    """Kills the 'process' the first time it runs for a step; returns its args after that."""
    _record(args, ctx)
    if _first_time(ctx):
        raise Crash(f"crash in {ctx.step_id}")
    return args


@tool("test_steal_once")
def steal_once_tool(args, ctx):
    """Another booking steals this run's lease (a new epoch) while the step runs, the first time only."""
    _record(args, ctx)
    if _first_time(ctx):
        leases.lease_reserve(run_id=ctx.run_id, task_id="thief", force=True)
    return args


@tool("test_cancel")
def cancel_tool(args, ctx):
    """An operator cancels the run while this step runs."""
    _record(args, ctx)
    run_cancel(run_id=ctx.run_id, by="alice", reason="changed my mind")
    return args


def calls(run, step_id: str | None = None) -> list[dict]:
    return [c for c in CALLS[str(run.id)] if step_id is None or c["step_id"] == step_id]


class CrashingEmailBackend(BaseEmailBackend):
    """The process dies while talking to the mail server: the message may or may not have left."""

    def send_messages(self, email_messages):
        raise Crash("died while sending mail")


class LoginOutboxEmailBackend(locmem.EmailBackend):
    """locmem's outbox, taking the login options an SMTP mailer has: its password is a configured secret."""

    def __init__(self, *, username="", password="", **kwargs):
        super().__init__(**kwargs)
        self.username, self.password = username, password


LOCMEM_MAIL = "django.core.mail.backends.locmem.EmailBackend"
CRASHING_MAIL = "tests.factories.CrashingEmailBackend"
SMTP_MAIL = "django.core.mail.backends.smtp.EmailBackend"
LOGIN_OUTBOX_MAIL = "tests.factories.LoginOutboxEmailBackend"


def mailer(backend: str, **options) -> dict:
    """Django's MAILERS with one default mailer of that backend and options: `settings.MAILERS = mailer(...)`."""
    return {"default": {"BACKEND": backend, "OPTIONS": options}}


# --- workflows and runs -------------------------------------------------------------------------------


def echo_step(step_id: str, **args) -> dict:
    return {"id": step_id, "kind": "tool_call", "tool": "echo", "args": args}


def tool_step(step_id: str, name: str, args: dict | None = None, **extra) -> dict:
    return {"id": step_id, "kind": "tool_call", "tool": name, "args": args or {}, **extra}


def make_workflow(*, steps: list[dict], name: str | None = None):
    return workflow_create(definition={"name": name or f"wf-{uuid.uuid4().hex[:10]}", "steps": steps})


def make_run(*, steps: list[dict] | None = None, workflow=None, input: dict | None = None) -> Run:
    """A queued run booked for its first task, exactly as the API creates it."""
    workflow = workflow or make_workflow(steps=steps or [echo_step("only", said="hello")])
    run, _ = run_create(workflow_name=workflow.name, version=workflow.version, input=input or {})
    return run


# --- driving ------------------------------------------------------------------------------------------


def booked_task_id(run) -> str:
    """The Celery task id the run's lease is booked for (owner "task:<id>")."""
    owner = RunLock.objects.get(run_id=run.id).owner
    assert owner.startswith("task:"), f"run {run.id} is held by {owner}, not booked for a task"
    return owner.removeprefix("task:")


def drive(run) -> str:
    """What a worker does on receiving the run's booked task: one slice of the walk, inline."""
    result = run_drive(run_id=run.id, task_id=booked_task_id(run))
    run.refresh_from_db()
    return result


def drive_to_end(run, *, limit: int = 100) -> int:
    """Drive slice after slice (each handoff books a new task) until the run ends; returns the drives."""
    for number in range(1, limit + 1):
        drive(run)
        if run.status in FINAL_STATUSES or run.status == RunStatus.WAITING:
            return number
    raise AssertionError(f"run {run.id} did not end after {limit} drives")


def expire_lease(run) -> None:
    """The holder stopped beating (it died): its lease is past its time."""
    RunLock.objects.filter(run_id=run.id).update(expires_at=timezone.now() - timedelta(seconds=1))


def journal_by_hand(run, *events: NewEvent) -> None:
    """Write events as a worker that died right after would have left them (unfenced)."""
    events_append(run_id=run.id, events=list(events), writer="test")


def recover(run) -> None:
    """The worker died holding the lease: once it expires, the sweep books the run for a new task."""
    from runs.recovery import sweep_once

    expire_lease(run)
    assert str(run.id) in sweep_once().redriven


class SentDrives(list):
    """Stands in for the drive task's sender (runs.dispatch.drive): records what would go to the broker."""

    def apply_async(self, args, task_id, countdown=None):
        self.append({"run_id": args[0], "task_id": task_id, "countdown": countdown})

    def send_many(self, bookings):  # runs.dispatch.drives_send: new runs' first tasks
        for run_id, task_id in bookings:
            self.apply_async(args=[str(run_id)], task_id=task_id)


def record_drive_sends(monkeypatch) -> SentDrives:
    sent = SentDrives()
    monkeypatch.setattr("runs.dispatch.drive", sent)
    monkeypatch.setattr("runs.dispatch.drives_send", sent.send_many)
    return sent


# --- reading ------------------------------------------------------------------------------------------


def events(run) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(run_id=run.id).order_by("seq"))


def kinds(run) -> list[str]:
    return [e.kind for e in events(run)]


def step_events(run, kind: str, step_id: str | None = None) -> list[JournalEvent]:
    return [e for e in events(run) if e.kind == kind and (step_id is None or e.step_id == step_id)]


def needs_concurrent_database() -> None:
    """Fail (never skip) a test whose threads each need their own connection to one shared database.

    Postgres is that; so is an SQLite file (WAL, busy timeout). Django's in-memory SQLite test database is
    not: its shared-cache table locks fail at once ("database table is locked") instead of waiting.
    """
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.fail(
            "this test runs threads on one database: use Postgres (DATABASE_URL=postgres://...) or give the "
            "SQLite test database a file (DATABASES['default']['TEST']['NAME'])",
            pytrace=False,
        )

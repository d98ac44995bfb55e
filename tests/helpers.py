"""What tests share: workflows and runs in one line, runs driven inline, test tools, bounded waits, reading the
journal, and the durability tests' workers (real `celery -A pal worker` processes against the test's database and
broker: no beat runs, a test plays it with sweep_until_end). Plain functions, not fixtures, so any test module can
import them; the tools are registered on import and record what they saw per run id."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.mail.backends import locmem
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection
from django.utils import timezone

from journal.models import JournalEvent
from journal.services import NewEvent, events_append
from runs import leases, recovery
from runs.dispatch import broker_priority
from runs.errors import StepError
from runs.models import FINAL_STATUSES, Run, RunLock, RunStatus, SideEffect
from runs.recovery import sweep_once
from runs.services import run_cancel, run_create, workflow_create
from runs.steps.tools import tool
from runs.walk import run_drive
from tests.support.peers import LLMProvider, default_reply

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
CRASHING_MAIL = "tests.helpers.CrashingEmailBackend"
SMTP_MAIL = "django.core.mail.backends.smtp.EmailBackend"
LOGIN_OUTBOX_MAIL = "tests.helpers.LoginOutboxEmailBackend"


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


def housekeeping_due(monkeypatch) -> None:
    """The next sweep of this process prunes (runs.recovery: once a HOUSEKEEPING_EVERY), as a first pass does."""
    monkeypatch.setattr(recovery, "_housekept_at", [-recovery.HOUSEKEEPING_EVERY])


def sweep_after_expiry(run) -> None:
    """The worker died holding the lease: once it expires, the sweep books the run for a new task (in this process:
    no worker runs it; drive() does). Not sweep_until_end, which waits for workers to end the run."""
    expire_lease(run)
    assert str(run.id) in sweep_once().redriven


class SentDrives(list):
    """Stands in for the drive task's sender (runs.dispatch.drive): records what would go to the broker."""

    def apply_async(self, args, task_id, countdown=None, priority=None):
        sent = {"run_id": args[0], "task_id": task_id, "countdown": countdown}
        self.append(sent if priority is None else {**sent, "priority": priority})

    def send_many(self, bookings):  # runs.dispatch.drives_send: new runs' first tasks (run_id, task_id, priority)
        for run_id, task_id, priority in bookings:
            self.apply_async(args=[str(run_id)], task_id=task_id, priority=broker_priority(priority))


def record_drive_sends(monkeypatch) -> SentDrives:
    sent = SentDrives()
    monkeypatch.setattr("runs.dispatch.drive", sent)
    monkeypatch.setattr("runs.dispatch.drives_send", sent.send_many)
    return sent


# --- reading ------------------------------------------------------------------------------------------


def events(run, kind: str | None = None, step_id: str | None = None) -> list[JournalEvent]:
    """The run's journal in seq order; only the events of this kind (and step) when given."""
    rows = list(JournalEvent.objects.filter(run_id=run.id).order_by("seq"))
    return rows if kind is None else [e for e in rows if e.kind == kind and (step_id is None or e.step_id == step_id)]


def kinds(run) -> list[str]:
    return [e.kind for e in events(run)]


def step_events(run, kind: str, step_id: str | None = None) -> list[JournalEvent]:
    return events(run, kind, step_id)


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


# --- the durability tests -------------------------------------------------------------------------------

LEASE_TTL = 2  # the same as the workers' (tests.conftest.worker_env), so the test's sweep agrees with them
POLL = 0.05
# Worker options for these tests: no mingle or gossip with other workers (they share nothing we need), which
# saves a second at every start. Pass as celery_workers(env, name=..., **QUICK).
QUICK = {"extra_args": ("--without-mingle", "--without-gossip")}


# --- workflows and runs ----------------------------------------------------------------------------


def llm(step_id: str, prompt: str) -> dict:
    return {"id": step_id, "kind": "llm_call", "model": "gpt-4o-mini", "prompt": prompt}


def sleep_tool(step_id: str, seconds: float) -> dict:
    return {"id": step_id, "kind": "tool_call", "tool": "sleep", "args": {"seconds": seconds}}


def echo(step_id: str, **args) -> dict:
    return {"id": step_id, "kind": "tool_call", "tool": "echo", "args": args or {"done": True}}


def webhook(step_id: str, url: str, body: dict) -> dict:
    return {"id": step_id, "kind": "deliver", "channel": "webhook", "url": url, "body": body}


def email(step_id: str, to: str, subject: str, body: str) -> dict:
    return {"id": step_id, "kind": "deliver", "channel": "email", "to": [to], "subject": subject, "body": body}


def start_run(*steps: dict, input: dict | None = None) -> Run:
    """Post a one-off workflow of these steps and create a run of it; its first task goes to Redis now."""
    name = f"durability-{uuid.uuid4().hex[:10]}"
    workflow_create(definition={"name": name, "steps": list(steps)})
    run, created = run_create(workflow_name=name, input=input or {})
    assert created
    return run


def key(run: Run, step_id: str, attempt: int = 1) -> str:
    """The contract's key of a step attempt: {run_id}:{step_id}:{attempt}."""
    return f"{run.id}:{step_id}:{attempt}"


# --- the journal -----------------------------------------------------------------------------------


def describe(run: Run) -> str:
    """The run's state in a few lines, for a failure message."""
    run.refresh_from_db()
    lock = RunLock.objects.filter(run_id=run.id).values("owner", "epoch", "expires_at").first()
    rows = "\n".join(
        f"  {e.seq:>3} {e.kind:<22} {e.step_id or '':<8} a={e.attempt} epoch={e.epoch} writer={e.writer} "
        f"{_short(e.payload)}"
        for e in events(run)
    )
    effects = list(SideEffect.objects.filter(run_id=run.id).values_list("key", "status"))
    return f"run {run.id} is {run.status}; lease {lock}; side effects {effects}\njournal:\n{rows}"


def _short(payload: Any, limit: int = 120) -> str:
    text = str(payload)
    return text if len(text) <= limit else text[:limit] + "…"


def assert_gap_free(run: Run) -> None:
    seqs = [e.seq for e in events(run)]
    assert seqs == list(range(1, len(seqs) + 1)), f"journal seqs have a gap or a repeat: {seqs}\n{describe(run)}"


# --- waiting ---------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, explain: Callable[[], str] = str):
    """Poll until predicate() is truthy and return its value; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}, in vain\n{explain()}")
        time.sleep(POLL)


def queue_length(redis, queue: str = "celery") -> int:
    """How many messages wait on a queue of a Redis server of the test's own (tests.support.servers.start_redis),
    or of a RabbitMQ of its own (tests.support.rabbitmq)."""
    if hasattr(redis, "queue_length"):
        return redis.queue_length(queue)
    import redis as redis_client

    client = redis_client.Redis.from_url(redis.url, socket_timeout=5)
    try:
        return client.llen(queue)
    finally:
        client.close()


def wait_for_event(run: Run, kind: str, step_id: str | None = None, *, timeout: float = 30.0) -> JournalEvent:
    found = wait_until(
        lambda: events(run, kind, step_id),
        timeout=timeout,
        what=f"a {kind} event{f' of step {step_id}' if step_id else ''} in run {run.id}",
        explain=lambda: describe(run),
    )
    return found[0]


def sweep_until_end(run: Run, *, timeout: float = 60.0, sweep_every: float = 0.25) -> Run:
    """Play the beat scheduler for the workers: sweep every `sweep_every` seconds until the run has ended; return
    it fresh. Not sweep_after_expiry, which sweeps once, in this process, after expiring the lease."""
    deadline = time.monotonic() + timeout
    while True:
        sweep_once(who="test-beat")
        run.refresh_from_db()
        if run.status in FINAL_STATUSES:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"the run did not end within {timeout}s of sweeping\n{describe(run)}")
        time.sleep(sweep_every)


def wait_for_end(run: Run, *, timeout: float = 60.0) -> Run:
    """Wait for the run to end without any sweep."""
    wait_until(
        lambda: Run.objects.filter(id=run.id, status__in=FINAL_STATUSES).exists(),
        timeout=timeout,
        what=f"run {run.id} to end",
        explain=lambda: describe(run),
    )
    run.refresh_from_db()
    return run


# --- peers -----------------------------------------------------------------------------------------


def hold_calls_containing(provider: LLMProvider, marker: str, seconds: float) -> None:
    """Make the provider sit on a new (billed) call whose last message contains `marker` for `seconds`,
    and answer every other new call at once. A replayed key keeps the delay of the last billed call, so a
    test sets provider.delay = 0 itself once the held call has done its job."""

    def reply(body: dict) -> str:
        last = str((body.get("messages") or [{}])[-1].get("content", ""))
        provider.delay = seconds if marker in last else 0.0
        return default_reply(body)

    provider.reply = reply


def calls_with_key(provider, idempotency_key: str) -> list:
    return [c for c in provider.requests if c.idempotency_key == idempotency_key]


# --- graphs (issue 12) -----------------------------------------------------------------------------


def item_key(run: Run, step_id: str, index: int, attempt: int = 1) -> str:
    """The contract's key of a for_each item's attempt: {run_id}:{step_id}[{index}]:{attempt}."""
    return f"{run.id}:{step_id}[{index}]:{attempt}"


def item_states(run: Run, step_id: str) -> tuple[set[str], set[str]]:
    """(the items of step_id with a step_completed, the items started and without an outcome yet), by journal id."""
    completed: set[str] = set()
    started: set[str] = set()
    for e in events(run):
        if not (e.step_id or "").startswith(step_id + "["):
            continue
        if e.kind == "step_started":
            started.add(e.step_id)
        elif e.kind in ("step_completed", "step_failed"):
            started.discard(e.step_id)
            if e.kind == "step_completed":
                completed.add(e.step_id)
    return completed, started - completed


def assert_chain_holds(run: Run) -> None:
    """The run's journal chains, and reaches the head the run row recorded when it ended (nothing cut, nothing
    forged after it)."""
    from journal.chain import chain_verify

    run.refresh_from_db()
    report = chain_verify(run_id=run.id, expect_head=(run.journal_head_seq, run.journal_head_hash))
    assert report.ok, f"the journal chain breaks at seq {report.first_bad_seq}: {report.reason}\n{describe(run)}"


class PickyProvider(LLMProvider):
    """The local provider, refusing (HTTP 400: a definite failure) every call whose last message contains
    `refuse_marker` while `refusing` is set; every other call as usual."""

    def __init__(self, *, refuse_marker: str, **kwargs):
        super().__init__(**kwargs)
        self.refuse_marker = refuse_marker
        self.refusing = True

    def _decide(self, request):
        body = request.json
        messages = body.get("messages") if isinstance(body, dict) else None
        last = str((messages or [{}])[-1].get("content", "")) if isinstance(messages, list) else ""
        if self.refusing and self.refuse_marker in last:
            request.outcome = "rejected"
            return 400, {"error": {"message": "refused by the test", "code": "400"}}, None, "application/json"
        return super()._decide(request)

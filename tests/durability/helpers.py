"""What the durability tests share: workflows in one line, bounded waits, and reading the journal.

These tests run real `celery -A pal worker` processes against the test's Postgres database and the Redis
broker, and kill or freeze them. No beat process runs: a test drives recovery itself with sweep_once(),
which is what `celery -A pal beat` would call every PAL_RECOVERY_INTERVAL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from journal.models import JournalEvent
from runs.models import FINAL_STATUSES, Run, RunLock, SideEffect
from runs.recovery import sweep_once
from runs.services import run_create, workflow_create
from tests.support.peers import LLMProvider, default_reply

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


def journal(run: Run) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(run_id=run.id).order_by("seq"))


def events(run: Run, kind: str, step_id: str | None = None) -> list[JournalEvent]:
    return [e for e in journal(run) if e.kind == kind and (step_id is None or e.step_id == step_id)]


def describe(run: Run) -> str:
    """The run's state in a few lines, for a failure message."""
    run.refresh_from_db()
    lock = RunLock.objects.filter(run_id=run.id).values("owner", "epoch", "expires_at").first()
    rows = "\n".join(
        f"  {e.seq:>3} {e.kind:<22} {e.step_id or '':<8} a={e.attempt} epoch={e.epoch} writer={e.writer} "
        f"{_short(e.payload)}"
        for e in journal(run)
    )
    effects = list(SideEffect.objects.filter(run_id=run.id).values_list("key", "status"))
    return f"run {run.id} is {run.status}; lease {lock}; side effects {effects}\njournal:\n{rows}"


def _short(payload: Any, limit: int = 120) -> str:
    text = str(payload)
    return text if len(text) <= limit else text[:limit] + "…"


def assert_gap_free(run: Run) -> None:
    seqs = [e.seq for e in journal(run)]
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


def recover(run: Run, *, timeout: float = 60.0, sweep_every: float = 0.25) -> Run:
    """Play the beat scheduler: sweep every `sweep_every` seconds until the run has ended; return it fresh."""
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
    for e in journal(run):
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

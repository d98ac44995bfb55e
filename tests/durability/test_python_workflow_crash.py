"""A Python workflow under a kill -9 storm on real workers: every ctx call and @step done once, the run ends once.

The worker is SIGKILLed each time the journal has moved on since the last kill (a new step started), a new one
starts, and the test plays the beat (sweep_once) and the operator (approves when asked) until the run ends."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus, SideEffect, SideEffectStatus
from runs.recovery import sweep_once
from runs.services import approval_decide
from runs.steps.deliver import message_id_for
from tests.code import sample_workflows
from tests.helpers import QUICK, assert_gap_free, describe, events, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CODE = {"PAL_WORKFLOW_MODULES": "tests.code.sample_workflows"}


def step_starts(run) -> list[str]:
    return list(
        JournalEvent.objects.filter(run_id=run.id, kind="step_started")
        .order_by("seq")
        .values_list("step_id", flat=True)
    )


def test_a_python_workflow_with_every_ctx_call_ends_once_under_a_kill_storm(
    celery_workers, llm_provider, webhook_receiver, smtp_sink, tmp_path
):
    calls_file = tmp_path / "calls.jsonl"
    llm_provider.delay = 0.3  # each model call is held a while: some kills land inside one
    env = {
        **llm_provider.env(),
        **webhook_receiver.env(),
        **smtp_sink.env(),
        **CODE,
        "PAL_TEST_CALLS_FILE": str(calls_file),
    }
    worker = celery_workers(env, name="py-0", **QUICK)
    run_id = sample_workflows.py_peers.start(
        {"ticket": "printer on fire", "hook": webhook_receiver.url, "to": "ops@example.com", "seconds": 0.4}
    )
    run = Run.objects.get(id=run_id)
    kills, seen = 0, 0
    journal_at_kills: list[list[str]] = []

    def moved_or_ended():
        run.refresh_from_db()
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
            return True
        if run.status == RunStatus.WAITING and (run.waiting_on or {}).get("kind") == "approval":
            approval_decide(run_id=run.id, step_id="approval", approved=True, by="storm")
        sweep_once(who="test-beat")
        return len(step_starts(run)) > seen

    while True:
        wait_until(moved_or_ended, timeout=90, what="the journal to move on", explain=lambda: describe(run))
        if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.WAITING) or kills >= 8:
            break
        worker.kill()
        kills += 1
        seen = len(step_starts(run))
        journal_at_kills.append(step_starts(run))
        worker = celery_workers(env, name=f"py-{kills}", **QUICK)
    wait_until(
        lambda: moved_or_ended() and run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=120,
        what="the run to end",
        explain=lambda: describe(run),
    )

    print(f"{kills} kills; the steps started at each: {[len(j) for j in journal_at_kills]}")
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert kills >= 4, f"only {kills} kills landed: {journal_at_kills}"
    assert run.output["approved"] is True and run.output["child"] == {"total": 20}, run.output
    assert run.output["draft"].startswith("Reply to: DRAFT"), run.output
    # Each step of the code ended once, in call order, whatever the kills re-ran.
    completed = [e.step_id for e in events(run, "step_completed") if "[" not in (e.step_id or "")]
    assert completed == [
        "llm", "pause", "map", "webhook", "llm#2", "approval", "sleep", "email", "child", "pause#2",
    ], describe(run)  # fmt: skip
    assert len(events(run, "run_succeeded")) == 1
    # Each model key billed once; a call in flight at a kill was sent again under its key and replayed.
    assert llm_provider.billed == {f"{run.id}:llm:1": 1, f"{run.id}:llm#2:1": 1}, llm_provider.billed
    assert webhook_receiver.dedup == {f"{run.id}:webhook:1": 1} or (
        set(webhook_receiver.dedup) == {f"{run.id}:webhook:1"}
        and SideEffect.objects.get(key=f"{run.id}:webhook:1").status == SideEffectStatus.DELIVERED
    ), webhook_receiver.dedup
    mail_key = f"{run.id}:email:1"
    assert smtp_sink.message_ids.count(message_id_for(mail_key)) <= 1
    # Each @step call ran under its own key; a key ran again only when a kill landed inside it.
    lines = [json.loads(line) for line in calls_file.read_text().splitlines()]
    by_key: dict[str, int] = {}
    for line in lines:
        by_key[line["key"]] = by_key.get(line["key"], 0) + 1
    own = {k: n for k, n in by_key.items() if k.startswith(str(run.id))}
    assert set(own) == {
        f"{run.id}:pause:1", f"{run.id}:pause#2:1", *(f"{run.id}:map[{i}]:1" for i in range(4))
    }, own  # fmt: skip
    assert all(n <= 1 + kills for n in own.values()), own
    assert sum(own.values()) - len(own) <= kills, (own, kills)
    assert_gap_free(run)

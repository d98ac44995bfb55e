"""A Python workflow under a kill -9 storm on real workers: every ctx call and @step done once, the run ends once.

The worker is SIGKILLed each time the journal has moved on since the last kill (another step started), a new one
starts, and the test plays the beat (sweep_once), the operator (approves when asked) and the sender of a signal
(once, when the run waits on it) until the run ends."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus, SideEffect, SideEffectStatus, Signal
from runs.recovery import sweep_once
from runs.services import approval_decide, signal_send
from runs.steps.deliver import message_id_for
from tests.code import sample_workflows
from tests.helpers import QUICK, assert_gap_free, describe, events, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CODE = {"PAL_WORKFLOW_MODULES": "tests.code.sample_workflows"}


def step_starts(run) -> list[str]:
    """The steps (and items) started so far, each once, in the order of their first start: a resumed start of a
    step killed before is not the journal moving on, or the storm would kill that step for ever."""
    started = JournalEvent.objects.filter(run_id=run.id, kind="step_started").order_by("seq")
    return list(dict.fromkeys(started.values_list("step_id", flat=True)))


ON_NEW_STEPS = "the test kills the worker each time another step started"
AFTER_EACH_CALL = "the worker kills itself right after each ctx call returned"
# The ctx calls of py-peers in order, as killed_after names them (the test's KilledAfterEachCall).
CTX_CALLS = [
    "01-llm", "02-now", "03-uuid", "04-random", "05-tool", "06-map", "07-webhook", "08-llm", "09-approval",
    "10-signal", "11-sleep", "12-email", "13-task", "14-child",
]  # fmt: skip


@pytest.mark.parametrize("storm", [ON_NEW_STEPS, AFTER_EACH_CALL])
def test_a_python_workflow_with_every_ctx_call_ends_once_under_a_kill_storm(
    storm, celery_workers, llm_provider, webhook_receiver, smtp_sink, tmp_path
):
    calls_file, marks, kill_marks = tmp_path / "calls.jsonl", tmp_path / "task-calls", tmp_path / "kills"
    marks.mkdir()
    kill_marks.mkdir()
    llm_provider.delay = 0.3  # each model call is held a while: some kills land inside one
    env = {
        **llm_provider.env(),
        **webhook_receiver.env(),
        **smtp_sink.env(),
        **CODE,
        "PAL_TEST_CALLS_FILE": str(calls_file),
    }
    if storm == AFTER_EACH_CALL:
        env["PAL_TEST_KILL_DIR"] = str(kill_marks)
    worker = celery_workers(env, name="py-0", **QUICK)
    run_id = sample_workflows.py_peers.start(
        {
            "ticket": "printer on fire",
            "hook": webhook_receiver.url,
            "to": "ops@example.com",
            "seconds": 0.4,
            "marks": str(marks),
        }
    )
    run = Run.objects.get(id=run_id)
    kills, seen = 0, 0
    journal_at_kills: list[list[str]] = []

    def ended() -> bool:
        """Play the operator and the beat; whether the run has ended."""
        run.refresh_from_db()
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
            return True
        waits_on = (run.waiting_on or {}).get("kind") if run.status == RunStatus.WAITING else None
        if waits_on == "approval":
            approval_decide(run_id=run.id, step_id="approval", approved=True, by="storm")
        if waits_on == "signal" and not Signal.objects.filter(run_id=run.id).exists():
            signal_send(run_id=run.id, name="go", payload={"go": "ahead"}, by="storm")
        sweep_once(who="test-beat")
        return False

    def moved_or_ended():
        return ended() or (len(step_starts(run)) > seen if storm == ON_NEW_STEPS else not worker.alive)

    while True:
        wait_until(moved_or_ended, timeout=90, what="the journal to move on", explain=lambda: describe(run))
        if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.WAITING) or kills >= 40:
            break
        worker.kill()  # or, when it killed itself, reap it
        kills += 1
        seen = len(step_starts(run))
        journal_at_kills.append(step_starts(run))
        worker = celery_workers(env, name=f"py-{kills}", **QUICK)
    wait_until(
        lambda: ended() and run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=120,
        what="the run to end",
        explain=lambda: describe(run),
    )

    print(f"{kills} kills; the last step started at each: {[j[-1] for j in journal_at_kills]}")
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    if storm == ON_NEW_STEPS:
        assert kills >= 4, f"only {kills} kills landed: {journal_at_kills}"
        assert "pause#2" in journal_at_kills[-1], journal_at_kills  # the storm went on to the code's last step
    else:  # one kill right after each ctx call, every one of them
        assert sorted(p.name for p in kill_marks.iterdir()) == CTX_CALLS and kills == len(CTX_CALLS)
    assert run.output["approved"] is True and run.output["child"] == {"total": 20}, run.output
    assert run.output["draft"].startswith("Reply to: DRAFT"), run.output
    # Each step of the code ended once, in call order, whatever the kills re-ran.
    completed = [e.step_id for e in events(run, "step_completed") if "[" not in (e.step_id or "")]
    assert completed == [
        "llm", "now", "uuid", "random", "pause", "tool", "map", "webhook", "llm#2", "approval", "signal", "sleep",
        "email", "charge", "child", "pause#2",
    ], describe(run)  # fmt: skip
    assert len(events(run, "run_succeeded")) == 1
    # ctx.now / uuid / random: what every replay got is what the journal holds, the first walk's values.
    journaled = {e.step_id: e.payload["output"] for e in events(run, "step_completed")}
    assert run.output["when"] == journaled["now"] and run.output["token"] == journaled["uuid"]
    assert run.output["luck"] == journaled["random"]
    assert run.output["stamped"] == {"stamped": f"printer on fire at {journaled['now']}"}
    # The signal: sent once, consumed once, its payload the step's output.
    assert run.output["signal"] == {"go": "ahead"} and Signal.objects.filter(run_id=run.id).count() == 1
    (received,) = events(run, "signal_received")
    assert received.step_id == "signal"
    # The task: called under the step's key only (again only if a kill landed inside a call), its output the first.
    task_keys = [p.read_text() for p in marks.iterdir()]
    assert set(task_keys) == {f"{run.id}:charge:1"} and len(task_keys) <= 1 + kills, task_keys
    assert run.output["charged"] == {"charged": True, "key": f"{run.id}:charge:1", "run": str(run.id)}
    assert len(events(run, "task_called")) >= len(task_keys)  # each call journaled before it was made
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
        f"{run.id}:pause:1", f"{run.id}:pause#2:1", f"{run.id}:tool:1", *(f"{run.id}:map[{i}]:1" for i in range(4))
    }, own  # fmt: skip
    assert all(n <= 1 + kills for n in own.values()), own
    assert sum(own.values()) - len(own) <= kills, (own, kills)
    assert_gap_free(run)

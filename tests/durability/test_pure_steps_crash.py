"""Pure steps in one commit under kill -9 on real workers (issue 29 section 2): the worker is killed each time the
journal moves on, while runs of pure steps (their rows waiting for a shared commit) alternate with effects (a
tool that is not pure, and a webhook), in a JSON workflow and in a Python one (@step(pure=True) calls between
ctx.tool and ctx.webhook). Every run succeeds, the receiver gets each key once, and the only steps that
ever ran again are pure ones, or an effect resumed under its same key where a kill landed inside it."""

import json
import time
from collections import Counter

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from runs.recovery import sweep_once
from tests.code import pure_tools
from tests.helpers import QUICK, assert_gap_free, describe, start_run, wait_until, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROUNDS, PURE = 4, 6


def steps(hook: str) -> list[dict]:
    out: list[dict] = []
    for r in range(ROUNDS):
        out += [
            {"id": f"p{r}_{i}", "kind": "tool_call", "tool": "count_pure", "args": {"n": i, "nap": 0.05}}
            for i in range(PURE)
        ]
        out.append({"id": f"effect{r}", "kind": "tool_call", "tool": "count_effect", "args": {"n": r}})
        out.append(webhook(f"hook{r}", hook, {"round": r}))
    return out


def expected(run, hook: str) -> list[str]:
    """The step ids the run completes: the JSON steps, or the Python workflow's calls in call order."""
    if run.workflow.definition.get("code"):
        calls = [f"p#{n}" if n > 1 else "p" for n in range(1, ROUNDS * PURE + 1)]
        return calls + [f"{name}#{r + 1}" if r else name for name in ("effect", "hook") for r in range(ROUNDS)]
    return [step["id"] for step in steps(hook)]


def started(run) -> int:
    return JournalEvent.objects.filter(run_id=run.id, kind="step_started").count()


def test_a_kill_storm_re_runs_only_pure_steps(celery_workers, webhook_receiver, tmp_path):
    assert pure_tools.count_pure  # the test process validates the workflow: its tools are registered here too
    calls_file = tmp_path / "calls.jsonl"
    env = {
        **webhook_receiver.env(),
        "PAL_WORKFLOW_MODULES": "tests.code.pure_tools",
        "PAL_TEST_CALLS_FILE": str(calls_file),
        "PAL_PURE_BATCH_STEPS": "20",
        "PAL_PURE_BATCH_MS": "1000",  # a batch of pure steps is as long as it can be: a kill takes rows with it
    }
    worker = celery_workers(env, name="pure-0", **QUICK)
    python_input = {"rounds": ROUNDS, "pure": PURE, "nap": 0.05, "hook": webhook_receiver.url}
    runs = [start_run(*steps(webhook_receiver.url)), Run.objects.get(id=pure_tools.pure_rounds.start(python_input))]
    kills, seen = 0, 0

    def moved_or_ended():
        sweep_once(who="test-beat")
        now = sum(started(run) for run in runs)
        ended = all(Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED for run in runs)
        return ended or now > seen + 3

    while kills < 8:
        wait_until(moved_or_ended, timeout=90, what="the journal to move on", explain=lambda: describe(runs[0]))
        if all(Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED for run in runs):
            break
        time.sleep(0.15)  # past the effect and the webhook just written: into the next batch of pure steps
        worker.kill()
        kills += 1
        seen = sum(started(run) for run in runs)
        worker = celery_workers(env, name=f"pure-{kills}", **QUICK)
    wait_until(
        lambda: (
            sweep_once(who="test-beat") is not None
            and all(Run.objects.get(id=run.id).status in (RunStatus.SUCCEEDED, RunStatus.FAILED) for run in runs)
        ),
        timeout=120,
        what="the runs to end",
        explain=lambda: describe(runs[0]),
    )

    lines = [json.loads(line) for line in calls_file.read_text().splitlines()]
    ran: dict[str, list[dict]] = {}
    for line in lines:
        ran.setdefault(line["key"], []).append(line)
    again = {key: calls for key, calls in ran.items() if len(calls) > 1}
    pure_again = sorted(key for key, calls in again.items() if calls[0]["pure"])
    print(f"{kills} kills; pure steps run again: {len(pure_again)}; effects run again: {len(again) - len(pure_again)}")
    print("pure steps run again, by run:", dict(Counter(key.split(":")[0] for key in pure_again)))
    assert kills >= 3, kills
    assert pure_again, "no kill landed in a batch of pure steps"  # what the kills took, the replay ran again
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, describe(run)
        assert_gap_free(run)
        # Each step completed once, every one of them.
        completed = list(
            JournalEvent.objects.filter(run_id=run.id, kind="step_completed").values_list("step_id", flat=True)
        )
        assert sorted(completed) == sorted(expected(run, webhook_receiver.url)), describe(run)
        # The pure steps shared commits (their rows carry their commit's moment): far fewer moments than steps.
        moments = set(
            JournalEvent.objects.filter(run_id=run.id, kind="step_completed", step_id__startswith="p").values_list(
                "created_at", flat=True
            )
        )
        print(f"run {run.id}: {ROUNDS * PURE} pure steps written in {len(moments)} commits")
        assert len(moments) < ROUNDS * PURE / 2
    # The receiver got each webhook key once (it counts the deliveries it took, by key).
    assert all(n == 1 for n in webhook_receiver.dedup.values()) and len(webhook_receiver.dedup) == 2 * ROUNDS
    # An effect that ran again did so under its same key, its step resumed: a kill landed inside it, nothing else.
    for key, calls in again.items():
        if calls[0]["pure"]:
            continue
        run_id, step_id = key.split(":")[0], calls[0]["step_id"]
        starts = JournalEvent.objects.filter(run_id=run_id, kind="step_started", step_id=step_id)
        assert [e.payload.get("resumed", False) for e in starts.order_by("seq")][-1] is True, (key, calls)

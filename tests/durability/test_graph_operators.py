"""Waits, retries and cancels inside a graph (issue 12), on real workers: an approval parks only its branch, a
retry of a fan-out runs only its failed items again, a cancel stops every branch."""

import pytest

from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.services import approval_decide, run_cancel, run_retry
from tests.helpers import (
    QUICK,
    PickyProvider,
    assert_chain_holds,
    assert_gap_free,
    calls_with_key,
    describe,
    echo,
    events,
    item_key,
    llm,
    sleep_tool,
    start_run,
    wait_for_end,
    wait_for_event,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def status_is(run: Run, status: str):
    return lambda: Run.objects.filter(id=run.id, status=status).exists()


def test_an_approval_on_one_branch_waits_until_the_other_branch_has_run_its_three_steps(celery_workers):
    celery_workers(name="wait-a", **QUICK)
    run = start_run(
        {"id": "ok", "kind": "approval", "prompt": "Ship it?", "needs": []},
        {**sleep_tool("build", 1.5), "needs": []},
        sleep_tool("test", 1.5),  # needs the step listed before it: build
        sleep_tool("package", 1.5),
        {**echo("ship", shipped=True), "needs": ["ok", "package"]},
    )

    wait_for_event(run, "approval_requested", "ok", timeout=60)
    # The approval's branch has parked; the other branch still moves, so the run is running, not waiting.
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING, describe(run)
    assert events(run, "step_completed", "package") == [], describe(run)

    wait_until(status_is(run, RunStatus.WAITING), timeout=60, what="the run to wait", explain=lambda: describe(run))
    run.refresh_from_db()
    assert (run.waiting_on["kind"], run.waiting_on["step_id"]) == ("approval", "ok"), describe(run)
    assert not RunLock.objects.filter(run_id=run.id).exists(), describe(run)  # no worker holds a waiting run
    for sid in ("build", "test", "package"):
        assert len(events(run, "step_completed", sid)) == 1, describe(run)
    assert events(run, "step_started", "ship") == [], describe(run)
    assert len(events(run, "approval_requested", "ok")) == 1, describe(run)

    approval_decide(run_id=run.id, step_id="ok", approved=True, by="alice", comment="go")
    run = wait_for_end(run, timeout=60)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"shipped": True}
    (decided,) = events(run, "approval_decided", "ok")
    assert (decided.payload["approved"], decided.payload["by"]) == (True, "alice")
    for sid in ("ok", "build", "test", "package", "ship"):
        assert len(events(run, "step_started", sid)) == 1, describe(run)  # nothing ran twice
    assert events(run, "step_completed", "ship")[0].seq > decided.seq
    assert_gap_free(run)
    assert_chain_holds(run)


def test_an_approval_decided_while_the_other_branch_still_runs_is_taken_when_that_branch_ends(celery_workers):
    celery_workers(name="early-a", **QUICK)
    run = start_run(
        {"id": "ok", "kind": "approval", "prompt": "Ship it?", "needs": []},
        {**sleep_tool("build", 1.5), "needs": []},
        sleep_tool("test", 1.5),
        sleep_tool("package", 1.5),
        {**echo("ship", shipped=True), "needs": ["ok", "package"]},
    )
    wait_for_event(run, "approval_requested", "ok", timeout=60)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and not events(run, "step_completed", "package"), describe(run)

    approval_decide(run_id=run.id, step_id="ok", approved=True, by="alice", comment="early")
    run = wait_for_end(run, timeout=60)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.output == {"shipped": True}
    (decided,) = events(run, "approval_decided", "ok")
    assert (decided.payload["approved"], decided.payload["by"], decided.payload["attempt"]) == (True, "alice", 1)
    (completed,) = events(run, "step_completed", "ok")
    assert completed.payload["output"]["approved"] is True, describe(run)
    assert events(run, "step_started", "ship")[0].seq > events(run, "step_completed", "package")[0].seq
    for sid in ("ok", "build", "test", "package", "ship"):
        assert len(events(run, "step_started", sid)) == 1, describe(run)
    assert_gap_free(run)
    assert_chain_holds(run)


def test_a_retry_of_a_fan_out_with_two_refused_items_runs_only_those_items_again_under_their_next_keys(
    celery_workers,
):
    with PickyProvider(refuse_marker="REFUSE") as provider:
        celery_workers(provider.env(), name="retry-a", **QUICK)
        words = ["one", "REFUSE two", "three", "four", "REFUSE five", "six"]
        run = start_run(
            {**llm("fan", "Say {{ item }} ({{ index }})"), "needs": [], "for_each": "{{ input.words }}"},
            {**echo("after", said="{{ steps.fan.output }}")},
            input={"words": words},
        )
        run = wait_for_end(run, timeout=60)

        assert run.status == RunStatus.FAILED, describe(run)
        assert run.error["step_id"] in ("fan[1]", "fan[4]"), describe(run)
        assert run.error["code"] != "internal_error", describe(run)
        failed = {e.step_id for e in events(run, "step_failed")}
        assert failed == {"fan[1]", "fan[4]"}, describe(run)
        calls_before = len(provider.calls)
        assert calls_before == len(words), describe(run)

        provider.refusing = False
        run_retry(run_id=run.id, by="otto", reason="the provider accepts them now")
        run = wait_for_end(run, timeout=60)

        assert run.status == RunStatus.SUCCEEDED, describe(run)
        again = provider.calls[calls_before:]
        assert sorted(c.idempotency_key for c in again) == sorted(
            [item_key(run, "fan", 1, attempt=2), item_key(run, "fan", 4, attempt=2)]
        ), describe(run)
        assert all(c.outcome == "billed" for c in again)
        for i in (0, 2, 3, 5):  # succeeded the first time: reused, never called again
            assert len(calls_with_key(provider, item_key(run, "fan", i))) == 1
            assert len(events(run, "step_started", f"fan[{i}]")) == 1, describe(run)
        assert [o["text"] for o in run.output["said"]] == [f"Reply to: Say {w} ({i})" for i, w in enumerate(words)]
        assert_gap_free(run)
        assert_chain_holds(run)


def test_a_cancel_stops_four_parallel_sleeps_and_the_worker_takes_the_next_run(celery_workers):
    worker = celery_workers(name="cancel-g", **QUICK)
    run = start_run(
        *[{**sleep_tool(f"long{i}", 30), "needs": []} for i in range(4)],
        {**echo("after"), "needs": [f"long{i}" for i in range(4)]},
    )
    wait_until(
        lambda: len({e.step_id for e in events(run, "step_started")}) == 4,
        timeout=60,
        what="the four sleeps to start",
        explain=lambda: describe(run),
    )

    run_cancel(run_id=run.id, by="alice", reason="not needed")

    # Every branch's sleep checks the lease at its next nap: the walk stops without writing, well before 30 s.
    worker.wait_for_log(rf"run {run.id}: .*stopping without writing", timeout=20)
    other = start_run(echo("only", ok=True))
    other = wait_for_end(other, timeout=60)
    assert other.status == RunStatus.SUCCEEDED, describe(other)
    sweep_once(who="test-beat")  # nothing to recover: a cancelled run has ended

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, describe(run)
    rows = events(run)
    (cancelled,) = [e for e in rows if e.kind == "run_cancelled"]
    assert [e.kind for e in rows if e.seq > cancelled.seq] == [], describe(run)
    assert events(run, "step_completed") == [], describe(run)
    assert events(run, "step_started", "after") == [], describe(run)
    assert not RunLock.objects.filter(run_id=run.id).exists(), describe(run)
    assert_gap_free(run)

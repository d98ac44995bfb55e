"""A frozen lease holder (SIGSTOP past its TTL) loses the run to another worker and, woken, is fenced out:
it writes no journal row and sends nothing more."""

import time

import pytest

from runs.models import RunStatus, SideEffect, SideEffectStatus
from tests.helpers import (
    QUICK,
    assert_gap_free,
    describe,
    echo,
    events,
    key,
    llm,
    sleep_tool,
    start_run,
    sweep_until_end,
    wait_for_event,
    wait_until,
    webhook,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_lease_holder_frozen_past_its_ttl_writes_and_sends_nothing_after_the_steal(
    celery_workers, llm_provider, webhook_receiver
):
    # A long slice: woken, A's next move is the journal append before the LLM call, not a slice handoff.
    env = {**llm_provider.env(), **webhook_receiver.env(), "PAL_SLICE_SECONDS": "60"}
    frozen = celery_workers(env, name="holder-a", **QUICK)
    run = start_run(
        sleep_tool("wait", 4),
        llm("draft", "DRAFT the announcement"),
        webhook("notify", webhook_receiver.url, {"text": "{{ steps.draft.output.text }}"}),
    )

    wait_for_event(run, "step_started", "wait")
    frozen.stop_signal()  # no heartbeat from here on: the lease expires after LEASE_TTL
    celery_workers(env, name="thief-b", **QUICK)
    run = sweep_until_end(run)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    steal = events(run, "run_redriven")[0]
    assert steal.payload["previous_lease"]["owner"].startswith("holder-a:"), describe(run)
    before_wake = [(e.seq, e.kind, e.writer, e.epoch) for e in events(run)]
    calls_before, requests_before = len(llm_provider.calls), len(webhook_receiver.requests)

    frozen.cont()
    # Woken, A finishes its sleep and tries to journal it: the fence refuses and A stops.
    frozen.wait_for_log(rf"run {run.id}: lease .* is no longer current; stopping without writing", timeout=20)
    time.sleep(1.0)  # anything A would still send has had time to arrive

    assert [(e.seq, e.kind, e.writer, e.epoch) for e in events(run)] == before_wake, describe(run)
    assert (len(llm_provider.calls), len(webhook_receiver.requests)) == (calls_before, requests_before)
    assert llm_provider.billed == {key(run, "draft"): 1}
    assert webhook_receiver.dedup == {key(run, "notify"): 1}
    # A wrote before the steal and never after; everything after it carries the steal's epoch or a later one.
    rows = events(run)
    assert any(e.writer.startswith("holder-a:") for e in rows if e.seq < steal.seq), describe(run)
    after = [e for e in rows if e.seq > steal.seq]
    assert not [e for e in after if e.writer.startswith("holder-a:")], describe(run)
    assert all(e.epoch is not None and e.epoch >= steal.epoch for e in after), describe(run)
    assert {e.writer.split(":")[0] for e in after} == {"thief-b"}, describe(run)
    assert_gap_free(run)


def test_a_lease_holder_frozen_inside_a_webhook_delivery_cannot_confirm_it_after_the_steal(
    celery_workers, webhook_receiver
):
    webhook_receiver.delay = 6  # A's request is held; A is frozen while it waits for the answer
    frozen = celery_workers(webhook_receiver.env(), name="sender-a", **QUICK)
    run = start_run(
        echo("prepare", summary="rollback done"),
        webhook("notify", webhook_receiver.url, {"summary": "{{ steps.prepare.output.summary }}"}),
    )
    notify_key = key(run, "notify")

    assert webhook_receiver.request_started.wait(30), describe(run)
    frozen.stop_signal()
    webhook_receiver.delay = 0  # B's delivery is answered at once
    celery_workers(webhook_receiver.env(), name="sender-b", **QUICK)
    run = sweep_until_end(run)
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    steal = events(run, "run_redriven")[0]
    # A's request gets its answer (into A's socket) only now; then A wakes up and reads it.
    wait_until(lambda: webhook_receiver.requests[0].status == 200, timeout=15, what="the receiver to answer A")
    before_wake = [(e.seq, e.kind, e.writer, e.epoch) for e in events(run)]

    frozen.cont()
    frozen.wait_for_log(rf"run {run.id}: lease .* is no longer current; stopping without writing", timeout=20)
    time.sleep(1.0)

    assert [(e.seq, e.kind, e.writer, e.epoch) for e in events(run)] == before_wake, describe(run)
    assert webhook_receiver.dedup == {notify_key: 2}
    assert len(webhook_receiver.requests) == 2
    # A claimed it under its epoch; B confirmed it once; A's late 200 changed nothing.
    effect = SideEffect.objects.get(run_id=run.id)
    assert effect.status == SideEffectStatus.DELIVERED
    assert effect.claimed_epoch < steal.epoch
    (delivered,) = events(run, "side_effect_delivered", "notify")
    assert delivered.writer.startswith("sender-b:") and delivered.seq > steal.seq
    assert not [e for e in events(run) if e.seq > steal.seq and e.writer.startswith("sender-a:")], describe(run)
    assert_gap_free(run)

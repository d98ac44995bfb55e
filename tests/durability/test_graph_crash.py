"""kill -9 and SIGSTOP inside a graph (issue 12): parallel branches and for_each items on real workers.

A walk runs its ready steps and items on threads of the walking worker process; the walk's own thread does every
database write, fenced by the run's lease. These tests kill or freeze that process while branches and items are in
flight and check that the re-drive resumes each one under its key, reuses every one that had completed and sends
nothing twice, and that a frozen walk, woken after the steal, writes and sends nothing.
"""

import time

import pytest

from runs.models import BranchLock, RunStatus, SideEffect, SideEffectStatus
from runs.steps.deliver import message_id_for
from tests.helpers import (
    QUICK,
    assert_chain_holds,
    assert_gap_free,
    calls_with_key,
    describe,
    echo,
    email,
    events,
    item_key,
    item_states,
    key,
    llm,
    sleep_tool,
    start_run,
    sweep_until_end,
    wait_until,
    webhook,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TOPICS = [f"topic-{i}" for i in range(12)]


def fan_out_graph(hook_url: str) -> list[dict]:
    """12 model calls four at a time, in parallel with 3 webhooks one at a time and an email; then a join."""
    return [
        {
            **llm("read", "READ {{ item }} ({{ index }})"),
            "needs": [],
            "for_each": "{{ input.topics }}",
            "max_concurrency": 4,
        },
        {
            **webhook("notify", hook_url, {"hook": "{{ item }}"}),
            "needs": [],
            "for_each": "{{ input.hooks }}",
            "max_concurrency": 1,
        },
        {**email("mail", "ops@example.com", "Fan-out {{ input.batch }}", "{{ input.topics }}"), "needs": []},
        {
            **echo("join", reads="{{ steps.read.output }}", hooks="{{ steps.notify.output }}"),
            "needs": ["read", "notify", "mail"],
        },
    ]


def test_a_kill_minus_nine_amid_fanned_out_items_resumes_only_the_open_ones_and_sends_nothing_twice(
    celery_workers, llm_provider, webhook_receiver, smtp_sink
):
    llm_provider.delay = 1.0  # each call is held a while: items are in flight when the worker dies
    webhook_receiver.delay = 1.0
    env = {**llm_provider.env(), **webhook_receiver.env(), **smtp_sink.env(), "PAL_SLICE_SECONDS": "60"}
    first = celery_workers(env, name="graph-a", **QUICK)
    hooks = ["alpha", "beta", "gamma"]
    run = start_run(*fan_out_graph(webhook_receiver.url), input={"topics": TOPICS, "hooks": hooks, "batch": 1})

    def some_done_some_open():
        completed, open_ = item_states(run, "read")
        return len(completed) >= 2 and open_

    wait_until(
        some_done_some_open, timeout=60, what="some read items done and some in flight", explain=lambda: describe(run)
    )
    first.kill()
    # What the journal held when the worker died: the walk's thread wrote all of it, so it is final for graph-a.
    done_before, open_before = item_states(run, "read")
    assert done_before and open_before, describe(run)
    hooks_delivered_before = {e.payload["key"] for e in events(run, "side_effect_delivered") if e.step_id != "mail"}
    hooks_claimed_before = {e.payload["key"] for e in events(run, "side_effect_claimed") if e.step_id != "mail"}
    crash_seq = events(run)[-1].seq

    llm_provider.delay = webhook_receiver.delay = 0
    celery_workers(env, name="graph-b", **QUICK)
    run = sweep_until_end(run, timeout=90)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    # Every item's output, in the order of its items, whatever order they ended in.
    expected = [f"Reply to: READ {topic} ({i})" for i, topic in enumerate(TOPICS)]
    (read_done,) = events(run, "step_completed", "read")
    assert [o["text"] for o in read_done.payload["output"]] == expected, describe(run)
    assert [o["text"] for o in run.output["reads"]] == expected
    assert len(events(run, "step_started", "read")) == 1, describe(run)  # the step began once; its items resumed

    # The provider billed each item's key once; a key was sent again only for an item in flight at the crash.
    read_keys = [item_key(run, "read", i) for i in range(len(TOPICS))]
    assert llm_provider.billed == {k: 1 for k in read_keys}, describe(run)
    for i, k in enumerate(read_keys):
        outcomes = [c.outcome for c in calls_with_key(llm_provider, k)]
        sid = f"read[{i}]"
        if sid in done_before:
            assert outcomes == ["billed"], f"{sid} completed before the crash and was called again\n{describe(run)}"
            assert len(events(run, "step_started", sid)) == 1, describe(run)
        elif sid in open_before:
            assert outcomes[1:] == ["replayed"] * (len(outcomes) - 1), (sid, outcomes)
            starts = [(e.attempt, e.payload.get("resumed", False)) for e in events(run, "step_started", sid)]
            (completed,) = events(run, "step_completed", sid)
            if "ran_on" in completed.payload:
                # Booked for the fleet before the crash: a worker ran it once and the new walk took its outcome.
                assert starts == [(1, False)], describe(run)
            else:
                assert starts == [(1, False), (1, True)], describe(run)
        else:
            assert outcomes == ["billed"], (sid, outcomes)
    assert [c.idempotency_key for c in llm_provider.calls if c.idempotency_key not in read_keys] == []
    # Nothing the dead worker had journaled as done was done again after the crash.
    redone = [e for e in events(run) if e.seq > crash_seq and e.kind == "step_started" and e.step_id in done_before]
    assert redone == [], describe(run)

    # Each webhook key reached the receiver as one delivery, or twice under the same key if it was in flight.
    hook_keys = [item_key(run, "notify", i) for i in range(len(hooks))]
    dedup = webhook_receiver.dedup
    assert set(dedup) == set(hook_keys), (dedup, describe(run))
    for k in hook_keys:
        allowed = 2 if k in hooks_claimed_before - hooks_delivered_before else 1
        assert 1 <= dedup[k] <= allowed, (k, dedup, hooks_claimed_before, hooks_delivered_before)
    assert all(d.signature_valid for d in webhook_receiver.deliveries)
    assert all(d.json == {"hook": hooks[hook_keys.index(d.idempotency_key)]} for d in webhook_receiver.deliveries)
    for k in hook_keys:
        effect = SideEffect.objects.get(key=k)
        assert effect.status == SideEffectStatus.DELIVERED, (k, effect.status)
        assert len([e for e in events(run, "side_effect_claimed") if e.payload["key"] == k]) == 1, describe(run)

    # The email went out once, or (claimed and not confirmed at the crash) was marked unconfirmed, never sent again.
    mail_key = key(run, "mail")
    mail = SideEffect.objects.get(key=mail_key)
    assert smtp_sink.message_ids.count(message_id_for(mail_key)) <= 1
    if mail.status == SideEffectStatus.DELIVERED:
        assert smtp_sink.message_ids == [message_id_for(mail_key)]
    else:
        assert mail.status == SideEffectStatus.UNCONFIRMED, describe(run)
    assert len(events(run, "side_effect_claimed", "mail")) == 1, describe(run)

    redriven = events(run, "run_redriven")
    assert redriven and redriven[0].payload["previous_lease"]["owner"].startswith("graph-a:"), describe(run)
    assert len(events(run, "run_succeeded")) == 1
    assert_gap_free(run)
    assert_chain_holds(run)


def test_a_frozen_walk_with_parallel_sleeps_writes_and_sends_nothing_after_the_steal(celery_workers, webhook_receiver):
    env = {**webhook_receiver.env(), "PAL_SLICE_SECONDS": "60"}
    frozen = celery_workers(env, name="zombie-a", **QUICK)
    run = start_run(
        {**sleep_tool("naps", 0), "args": {"seconds": "{{ item }}"}, "needs": [], "for_each": "{{ input.naps }}"},
        {**sleep_tool("solo", 4), "needs": []},
        {**sleep_tool("quick", 0.1), "needs": []},
        {**webhook("after", webhook_receiver.url, {"done": True}), "needs": ["naps", "solo", "quick"]},
        input={"naps": [4, 4, 4]},
    )

    def all_sleeping():
        started = {e.step_id for e in events(run, "step_started")}
        # No other worker took the items booked for the fleet: the walk took them back onto its own threads.
        return {"naps[0]", "naps[1]", "naps[2]", "solo"} <= started and not BranchLock.objects.filter(run_id=run.id)

    wait_until(all_sleeping, timeout=60, what="the four sleeps to run at once", explain=lambda: describe(run))
    frozen.stop_signal()  # no heartbeat from here on: the lease expires after LEASE_TTL
    celery_workers(env, name="thief-b", **QUICK)
    run = sweep_until_end(run, timeout=90)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    steal = events(run, "run_redriven")[0]
    assert steal.payload["previous_lease"]["owner"].startswith("zombie-a:"), describe(run)
    before_wake = [(e.seq, e.kind, e.step_id, e.writer, e.epoch) for e in events(run)]
    requests_before = len(webhook_receiver.requests)

    frozen.cont()
    # Woken, A's sleeping threads find the lease gone (or their outcomes reach a walk whose fence refuses them).
    frozen.wait_for_log(rf"run {run.id}: .*stopping without writing", timeout=30)
    time.sleep(1.0)  # anything A would still send has had time to arrive

    assert [(e.seq, e.kind, e.step_id, e.writer, e.epoch) for e in events(run)] == before_wake, describe(run)
    assert len(webhook_receiver.requests) == requests_before == 1
    assert webhook_receiver.dedup == {key(run, "after"): 1}
    rows = events(run)
    assert any(e.writer.startswith("zombie-a:") for e in rows if e.seq < steal.seq), describe(run)
    after = [e for e in rows if e.seq > steal.seq]
    assert [e for e in after if e.writer.startswith("zombie-a:")] == [], describe(run)
    assert all(e.epoch is not None and e.epoch >= steal.epoch for e in after), describe(run)
    assert {e.writer.split(":")[0] for e in after} == {"thief-b"}, describe(run)
    # Each sleep completed once, by the thief, and the run ended once.
    for sid in ("naps[0]", "naps[1]", "naps[2]", "solo"):
        (completed,) = events(run, "step_completed", sid)
        assert completed.writer.startswith("thief-b:"), describe(run)
    assert events(run, "step_completed", "naps")[0].payload["output"] == [{"slept": 4}] * 3
    assert len(events(run, "run_succeeded")) == 1
    assert_gap_free(run)
    assert_chain_holds(run)

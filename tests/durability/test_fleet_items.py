"""Items of a fan-out on the whole fleet (issue 12): booked by the run's walk, taken by any idle worker process,
each under a fenced lease of its own (runs.walk.fleet).

Real Celery worker processes, a real webhook receiver. What must hold: items run on several processes, never more
than max_concurrency at once; an item whose worker is killed (SIGKILL) is booked again under the same key and
delivered once; a frozen item worker (SIGSTOP), woken after its item was booked again, writes and sends nothing;
a cancel stops the items other workers run.
"""

import time

import pytest

from runs.models import BranchLock, RunStatus, SideEffect, SideEffectStatus
from runs.services import run_cancel
from tests.helpers import (
    QUICK,
    assert_chain_holds,
    assert_gap_free,
    describe,
    events,
    item_key,
    start_run,
    wait_for_end,
    wait_until,
    webhook,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The walk takes back an item no other worker took within PAL_ITEM_PICKUP_SECONDS (50 ms by default). On a loaded
# machine a worker can take longer than that to pick its task up, and then the walk runs every item itself and no
# item ever reaches another worker, which is what these tests are about: give the fleet seconds, not milliseconds.
FLEET = {"PAL_SLICE_SECONDS": "60", "PAL_ITEM_PICKUP_SECONDS": "5"}


def hooks_step(url: str, *, max_concurrency: int) -> dict:
    return {
        **webhook("hooks", url, {"n": "{{ item }}"}),
        "for_each": "{{ input.items }}",
        "max_concurrency": max_concurrency,
    }


def process_of(writer: str) -> str:
    """A journal writer's process: "name:pid:nonce" of a walk, "name:pid:nonce:item sid" of an item's worker."""
    return ":".join(writer.split(":")[:3])


def ran_on(run, sid: str) -> str:
    """The process that ran an item: its worker (ran_on) or, without one, the walk's own threads."""
    (completed,) = events(run, "step_completed", sid)
    return process_of(completed.payload.get("ran_on") or completed.writer)


def most_at_once(run, prefix: str) -> int:
    """The most items of a step between their step_started and their outcome at the same time, by the journal."""
    open_, most = set(), 0
    for e in events(run):
        if not (e.step_id or "").startswith(prefix + "["):
            continue
        if e.kind == "step_started":
            open_.add(e.step_id)
        elif e.kind in ("step_completed", "step_failed"):
            open_.discard(e.step_id)
        most = max(most, len(open_))
    return most


def walker_of(run) -> str:
    (started,) = events(run, "run_started")
    return process_of(started.writer)


def test_the_items_of_a_fan_out_run_on_several_worker_processes_at_most_max_concurrency_at_once(
    celery_workers, webhook_receiver
):
    webhook_receiver.delay = 0.6
    env = {**webhook_receiver.env(), **FLEET}
    for name in ("fleet-a", "fleet-b", "fleet-c"):
        celery_workers(env, name=name, **QUICK)
    items = list(range(9))
    run = wait_for_end(
        start_run(hooks_step(webhook_receiver.url, max_concurrency=3), input={"items": items}), timeout=90
    )

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    processes = {ran_on(run, f"hooks[{i}]") for i in items}
    assert len(processes) >= 2, describe(run)
    assert processes - {walker_of(run)}, f"no item ran outside the walk's process\n{describe(run)}"
    assert most_at_once(run, "hooks") <= 3, describe(run)
    # Each item delivered once, under its own key, claimed by whoever ran it.
    keys = [item_key(run, "hooks", i) for i in items]
    assert webhook_receiver.dedup == {k: 1 for k in keys}, describe(run)
    assert sorted(d.json["n"] for d in webhook_receiver.deliveries) == items
    assert all(SideEffect.objects.get(key=k).status == SideEffectStatus.DELIVERED for k in keys)
    assert [o["key"] for o in run.output] == keys  # the step's output: its items' outputs in order
    assert not BranchLock.objects.filter(run_id=run.id).exists()
    assert_gap_free(run)
    assert_chain_holds(run)


def _an_item_on_another_worker(run, walker_names: set[str]):
    """The first item a worker other than the walk's took: (its sid, that worker's name), once its webhook is out."""
    found = {}

    def claimed_elsewhere():
        for e in events(run, "side_effect_claimed"):
            if e.writer.endswith(f" {e.step_id}") and e.writer.split(":")[0] not in walker_names:
                found.update(sid=e.step_id, worker=e.writer.split(":")[0])
                return True
        return False

    wait_until(
        claimed_elsewhere, timeout=60, what="an item claimed on a worker of the fleet", explain=lambda: describe(run)
    )
    return found["sid"], found["worker"]


def test_an_item_whose_worker_is_killed_is_booked_again_under_the_same_key_and_delivered_once(
    celery_workers, webhook_receiver
):
    webhook_receiver.delay = 3.0  # the item is at the receiver when its worker dies
    env = {**webhook_receiver.env(), **FLEET}
    workers = {name: celery_workers(env, name=name, **QUICK) for name in ("fleet-a", "fleet-b")}
    run = start_run(hooks_step(webhook_receiver.url, max_concurrency=2), input={"items": [0, 1]})
    wait_until(lambda: events(run, "run_started"), timeout=30, what="the walk to start")
    walker = walker_of(run).split(":")[0]
    sid, helper = _an_item_on_another_worker(run, {walker})
    workers[helper].kill()
    webhook_receiver.delay = 0

    run = wait_for_end(run, timeout=90)  # the walk lives: it books the item again itself, no sweep needed
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    k = item_key(run, "hooks", int(sid[len("hooks[") : -1]))
    starts = [(e.attempt, e.payload.get("resumed", False)) for e in events(run, "step_started", sid)]
    assert starts == [(1, False), (1, True)], describe(run)  # the same attempt again: the same key
    assert 1 <= webhook_receiver.dedup[k] <= 2, (webhook_receiver.dedup, describe(run))  # sent again only under k
    assert set(webhook_receiver.dedup) == {item_key(run, "hooks", 0), item_key(run, "hooks", 1)}
    assert len([e for e in events(run, "side_effect_claimed") if e.payload["key"] == k]) == 1, describe(run)
    assert SideEffect.objects.get(key=k).status == SideEffectStatus.DELIVERED
    assert ran_on(run, sid).split(":")[0] != helper, describe(run)
    assert_gap_free(run)
    assert_chain_holds(run)


def test_a_frozen_item_worker_woken_after_its_item_was_booked_again_writes_and_sends_nothing(
    celery_workers, webhook_receiver
):
    webhook_receiver.delay = 3.0
    env = {**webhook_receiver.env(), **FLEET}
    workers = {name: celery_workers(env, name=name, **QUICK) for name in ("fleet-a", "fleet-b")}
    run = start_run(hooks_step(webhook_receiver.url, max_concurrency=2), input={"items": [0, 1]})
    wait_until(lambda: events(run, "run_started"), timeout=30, what="the walk to start")
    walker = walker_of(run).split(":")[0]
    sid, helper = _an_item_on_another_worker(run, {walker})
    k = item_key(run, "hooks", int(sid[len("hooks[") : -1]))
    # Frozen while its webhook is at the receiver (frozen between its last look at its lease and the send, it would
    # send once more when woken, under the same key: no check can close that gap; the key is what makes it safe).
    wait_until(
        lambda: any(r.idempotency_key == k for r in webhook_receiver.requests), timeout=30, what="the item's webhook"
    )
    workers[helper].stop_signal()  # its item's lease is no longer beaten
    webhook_receiver.delay = 0

    run = wait_for_end(run, timeout=90)
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    before_wake = [(e.seq, e.kind, e.step_id, e.writer) for e in events(run)]
    requests_before = len(webhook_receiver.requests)
    workers[helper].cont()
    # Woken, its item hears the receiver's answer and tries to confirm it: its lease is gone, so nothing is written.
    workers[helper].wait_for_log(r"Task runs\.tasks\.item\[[^\]]+\] succeeded in [0-9.e-]+s: 'fenced'", timeout=30)
    time.sleep(1.0)
    assert [(e.seq, e.kind, e.step_id, e.writer) for e in events(run)] == before_wake, describe(run)
    assert len(webhook_receiver.requests) == requests_before
    assert 1 <= webhook_receiver.dedup[k] <= 2
    assert SideEffect.objects.get(key=k).status == SideEffectStatus.DELIVERED
    assert_chain_holds(run)


def test_a_cancel_stops_the_items_that_other_workers_run(celery_workers, webhook_receiver):
    webhook_receiver.delay = 3.0
    env = {**webhook_receiver.env(), **FLEET}
    for name in ("fleet-a", "fleet-b"):
        celery_workers(env, name=name, **QUICK)
    run = start_run(hooks_step(webhook_receiver.url, max_concurrency=2), input={"items": [0, 1, 2, 3]})
    wait_until(lambda: events(run, "run_started"), timeout=30, what="the walk to start")
    walker = walker_of(run).split(":")[0]
    _an_item_on_another_worker(run, {walker})
    run_cancel(run_id=run.id, by="ops", reason="stop the fan-out")
    cancelled_at = events(run)[-1].seq
    time.sleep(5.0)  # the receiver answers the items in flight; their workers try to confirm

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, describe(run)
    after = [e for e in events(run) if e.seq > cancelled_at]
    assert after == [], describe(run)
    assert not BranchLock.objects.filter(run_id=run.id).exists()
    assert {d.json["n"] for d in webhook_receiver.deliveries} <= {0, 1}, "items after the cancel were sent"
    assert_chain_holds(run)

"""The run lease: reserve, acquire, steal, heartbeat, handoff, release, fence_check."""

from datetime import timedelta

import pytest
from django.utils import timezone

from journal.services import Fence, FencedOut, NewEvent, events_append
from runs import leases
from runs.models import Run, RunLock
from tests.helpers import expire_lease, make_workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    """A run with no lease at all (run_create would book one; these tests book their own)."""
    return Run.objects.create(workflow=make_workflow(steps=[{"id": "a", "kind": "tool_call", "tool": "echo"}]))


def lock(run) -> RunLock:
    return RunLock.objects.get(run_id=run.id)


def acquire(run, task_id):
    fence = leases.lease_acquire(run_id=run.id, task_id=task_id)
    if fence is not None:
        # The background heartbeat must not write to the test database from its own thread.
        leases.heartbeat.untrack(fence)
    return fence


# --- reserve and acquire --------------------------------------------------------------------------


def test_reserve_books_the_run_for_the_task_with_epoch_one(run):
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    assert fence == Fence(run.id, "task:t1", 1)
    assert (lock(run).owner, lock(run).epoch) == ("task:t1", 1)


def test_the_worker_holding_the_booked_task_acquires_the_lease_under_its_own_name(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = acquire(run, "t1")
    assert fence == Fence(run.id, leases.worker_id(), 2)
    assert (lock(run).owner, lock(run).epoch) == (leases.worker_id(), 2)


def test_acquire_is_refused_while_another_task_holds_a_live_booking(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    assert acquire(run, "t2") is None
    assert (lock(run).owner, lock(run).epoch) == ("task:t1", 1)


def test_acquire_is_refused_while_another_worker_holds_a_live_lease(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    RunLock.objects.filter(run_id=run.id).update(owner="elsewhere:1:abc")
    assert acquire(run, "t1") is None
    assert lock(run).owner == "elsewhere:1:abc"


def test_a_second_reservation_is_refused_while_the_first_is_live(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    assert leases.lease_reserve(run_id=run.id, task_id="t2") is None
    assert lock(run).owner == "task:t1"


def test_acquire_takes_a_run_with_no_lease_at_all(run):
    fence = acquire(run, "t1")
    assert fence is not None and lock(run).owner == leases.worker_id()


# --- steals and epochs ----------------------------------------------------------------------------


def test_an_expired_lease_can_be_stolen_by_another_task(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    expire_lease(run)
    fence = acquire(run, "t2")
    assert fence == Fence(run.id, leases.worker_id(), 2)


def test_an_expired_lease_can_be_rebooked_for_a_new_task(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    acquire(run, "t1")
    expire_lease(run)
    fence = leases.lease_reserve(run_id=run.id, task_id="t2")
    assert fence == Fence(run.id, "task:t2", 3)
    assert lock(run).expires_at > timezone.now()


def test_the_epoch_grows_by_one_at_every_acquisition_or_steal(run):
    epochs = [leases.lease_reserve(run_id=run.id, task_id="t1").epoch]
    epochs.append(acquire(run, "t1").epoch)
    expire_lease(run)
    epochs.append(leases.lease_reserve(run_id=run.id, task_id="t2").epoch)
    epochs.append(acquire(run, "t2").epoch)
    epochs.append(leases.lease_reserve(run_id=run.id, task_id="t3", force=True).epoch)
    assert epochs == [1, 2, 3, 4, 5]


def test_a_forced_reservation_steals_a_live_lease(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = leases.lease_reserve(run_id=run.id, task_id="operator", force=True)
    assert fence == Fence(run.id, "task:operator", 2)


def test_a_new_lease_after_a_release_continues_past_the_highest_journaled_epoch(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = acquire(run, "t1")
    events_append(run_id=run.id, events=[NewEvent("run_started")], fence=fence)
    leases.lease_release(fence=fence)
    assert leases.lease_reserve(run_id=run.id, task_id="t2").epoch == fence.epoch + 1


# --- heartbeat ------------------------------------------------------------------------------------


def test_heartbeat_extends_exactly_the_leases_its_walks_use_in_one_call(run):
    other = Run.objects.create(workflow=run.workflow)
    abandoned = Run.objects.create(workflow=run.workflow)
    foreign = Run.objects.create(workflow=run.workflow)
    for held in (run, other, abandoned, foreign):
        leases.lease_reserve(run_id=held.id, task_id=f"t-{held.id}")
    soon = timezone.now() + timedelta(seconds=1)
    RunLock.objects.filter(run_id__in=[run.id, other.id, abandoned.id]).update(owner="me:1:abc", expires_at=soon)
    RunLock.objects.filter(run_id=foreign.id).update(owner="them:2:def", expires_at=soon)
    used = [Fence(held.id, "me:1:abc", lock(held).epoch) for held in (run, other)]

    held = leases.lease_heartbeat(used)

    assert sorted(held) == sorted([str(run.id), str(other.id)])
    assert lock(run).expires_at > soon and lock(other).expires_at > soon
    # Same owner, but no walk uses it any more (its walk ended abnormally): left to expire, never kept alive.
    assert lock(abandoned).expires_at == soon
    assert lock(foreign).expires_at == soon


def test_heartbeat_never_revives_an_expired_lease(run):
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    expire_lease(run)
    assert leases.lease_heartbeat([fence]) == []
    assert lock(run).expires_at < timezone.now()


def test_heartbeat_does_not_extend_a_lease_whose_epoch_moved_on(run):
    old = leases.lease_reserve(run_id=run.id, task_id="t1")
    newer = leases.lease_reserve(run_id=run.id, task_id="t1")  # re-booked by the same task: epoch + 1
    before = lock(run).expires_at
    assert newer.epoch == old.epoch + 1
    assert leases.lease_heartbeat([old]) == []
    assert lock(run).expires_at == before


def test_heartbeat_of_a_process_that_uses_no_lease_writes_nothing(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    assert leases.lease_heartbeat([]) == []


# --- handoff and release --------------------------------------------------------------------------


def test_handoff_passes_the_lease_to_a_task_with_a_new_epoch(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = acquire(run, "t1")
    handed = leases.lease_handoff(fence=fence, task_id="next")
    assert handed == Fence(run.id, "task:next", fence.epoch + 1)
    assert (lock(run).owner, lock(run).epoch) == ("task:next", fence.epoch + 1)


def test_the_task_that_receives_a_handoff_can_acquire(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    leases.lease_handoff(fence=acquire(run, "t1"), task_id="next")
    assert acquire(run, "next") is not None


def test_handoff_of_a_lease_no_longer_ours_raises_and_changes_nothing(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = acquire(run, "t1")
    stolen = leases.lease_reserve(run_id=run.id, task_id="thief", force=True)
    with pytest.raises(FencedOut):
        leases.lease_handoff(fence=fence, task_id="next")
    assert (lock(run).owner, lock(run).epoch) == ("task:thief", stolen.epoch)


def test_release_deletes_the_lease(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    leases.lease_release(fence=acquire(run, "t1"))
    assert not RunLock.objects.filter(run_id=run.id).exists()


def test_release_of_a_lease_no_longer_ours_raises_and_keeps_the_new_holder(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    fence = acquire(run, "t1")
    leases.lease_reserve(run_id=run.id, task_id="thief", force=True)
    with pytest.raises(FencedOut):
        leases.lease_release(fence=fence)
    assert lock(run).owner == "task:thief"


def test_drop_removes_whatever_lease_the_run_has(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    leases.lease_drop(run_id=run.id)
    assert leases.lease_describe(run_id=run.id) is None


def test_describe_shows_owner_epoch_and_expiry(run):
    leases.lease_reserve(run_id=run.id, task_id="t1")
    described = leases.lease_describe(run_id=run.id)
    assert (described["owner"], described["epoch"]) == ("task:t1", 1)
    assert described["expires_at"]


# --- fence_check ----------------------------------------------------------------------------------


def test_fence_check_passes_for_the_current_lease(run):
    leases.fence_check(leases.lease_reserve(run_id=run.id, task_id="t1"))


def test_fence_check_raises_for_a_stale_epoch(run):
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    leases.lease_reserve(run_id=run.id, task_id="t1", force=True)
    with pytest.raises(FencedOut):
        leases.fence_check(fence)


def test_fence_check_raises_for_another_owner(run):
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    with pytest.raises(FencedOut):
        leases.fence_check(Fence(run.id, "task:impostor", fence.epoch))


def test_fence_check_raises_when_the_run_has_no_lease(run):
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    leases.lease_drop(run_id=run.id)
    with pytest.raises(FencedOut):
        leases.fence_check(fence)


def test_fence_check_does_not_look_at_expiry(run):
    # An expired lease that nobody stole is still the holder's: stalled means "no heartbeat", and until
    # someone else takes the run its writes are the only ones.
    fence = leases.lease_reserve(run_id=run.id, task_id="t1")
    expire_lease(run)
    leases.fence_check(fence)

"""The sweep at lease expiry, planned in the beat (issue 23 section 6): the beat's look sends a sweep as soon as a
lease expired or a timer came due since its last look, by the database's clock, and an idle fleet costs one read
per look; nothing rides on a countdown message that a worker holds."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, RunLock, RunStatus
from runs.recovery import EXPIRY_MARGIN, LOOK_POLL, TIMER_GRACE, RecoveryLook, recovery_look, sweep_once
from tests.helpers import make_run

pytestmark = pytest.mark.django_db


class SentSweeps(list):
    def apply_async(self, kwargs=None, countdown=None):
        self.append({"who": (kwargs or {}).get("who"), "countdown": countdown})


@pytest.fixture
def sent(monkeypatch, settings):
    settings.PAL_RECOVERY_INTERVAL = 30
    settings.PAL_LEASE_TTL = 30
    recorder = SentSweeps()
    monkeypatch.setattr("runs.dispatch.sweep", recorder)
    return recorder


def expires_in(run, seconds: float):
    RunLock.objects.filter(run_id=run.id).update(expires_at=timezone.now() + timedelta(seconds=seconds))


def test_an_idle_fleet_looks_once_a_ttl_and_sends_nothing(sent, django_assert_num_queries):
    look = RecoveryLook()
    with django_assert_num_queries(1):
        wait = look.tick()
    assert sent == [] and wait == pytest.approx(30, abs=0.5)
    assert look.tick() > 25  # not yet time: no read
    sweep_once()
    assert sent == []  # the sweep itself plans nothing any more: the beat does


def test_a_lease_that_expires_is_swept_at_once_after_its_expiry(sent):
    run = make_run()
    expires_in(run, 2)
    first = recovery_look(since=None)
    assert not first.due and first.next_in == pytest.approx(LOOK_POLL)  # a lease is held: look every second
    later = recovery_look(since=first.now)
    assert not later.due  # still live

    expires_in(run, -0.5)  # its worker died a TTL ago: no heartbeat moved it since
    assert recovery_look(since=later.now - timedelta(seconds=1)).due  # it expired between two looks
    assert not recovery_look(since=timezone.now()).due  # it expired before the last look, which sent the sweep


def test_the_next_look_comes_just_after_the_soonest_expiry_when_it_is_sooner_than_a_poll(sent):
    expires_in(make_run(), 0.5)
    look = recovery_look(since=None)
    assert look.next_in <= 0.5 + EXPIRY_MARGIN.total_seconds() + 0.05


def test_a_timer_that_comes_due_is_swept_once_its_own_wake_up_had_its_grace(sent):
    run = make_run()
    RunLock.objects.filter(run_id=run.id).delete()
    Run.objects.filter(id=run.id).update(status=RunStatus.WAITING, wake_at=timezone.now() + timedelta(seconds=3))
    first = recovery_look(since=None)
    assert not first.due and first.next_in <= LOOK_POLL  # due within a TTL: look every second

    Run.objects.filter(id=run.id).update(wake_at=timezone.now() - TIMER_GRACE - timedelta(milliseconds=100))
    assert recovery_look(since=first.now - timedelta(seconds=1)).due  # it came due between two looks
    assert not recovery_look(since=timezone.now()).due


def test_the_look_sends_the_sweep_without_a_countdown(sent, django_capture_on_commit_callbacks):
    run = make_run()
    look = RecoveryLook()
    look.tick()
    look.since -= timedelta(seconds=1)  # the last look was a second ago, and the lease expired since
    expires_in(run, -0.2)
    look.next_at = 0.0
    with django_capture_on_commit_callbacks(execute=True):  # the beat runs in autocommit: sent at once
        look.tick()
    assert sent == [{"who": "lease-expiry", "countdown": None}]


def test_the_look_can_be_turned_off(sent, settings, django_assert_num_queries):
    settings.PAL_SWEEP_AT_LEASE_EXPIRY = False
    with django_assert_num_queries(0):
        RecoveryLook().tick()

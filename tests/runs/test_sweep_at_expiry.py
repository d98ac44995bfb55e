"""The sweep at lease expiry (issue 15 section 2): after a pass, one more is planned just after the earliest lease
expiry when that comes before the beat's next tick, once however many sweeps run, and never when no lease is held."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import RunLock, SweepPlan
from runs.recovery import EXPIRY_MARGIN, sweep_at_lease_expiry, sweep_once
from tests.factories import make_run

pytestmark = pytest.mark.django_db


class SentSweeps(list):
    def apply_async(self, kwargs, countdown):
        self.append({"who": kwargs["who"], "countdown": countdown})


@pytest.fixture
def sent(monkeypatch, settings):
    settings.PAL_RECOVERY_INTERVAL = 30
    recorder = SentSweeps()
    monkeypatch.setattr("runs.dispatch.sweep", recorder)
    return recorder


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Call fn as if its transaction committed: what it sends on commit goes at once."""

    def call(fn):
        with django_capture_on_commit_callbacks(execute=True):
            return fn()

    return call


def expires_in(run, seconds: float):
    RunLock.objects.filter(run_id=run.id).update(expires_at=timezone.now() + timedelta(seconds=seconds))


def test_a_lease_expiring_before_the_next_tick_plans_one_sweep_just_after_it(sent, committed):
    run = make_run()
    expires_in(run, 20)  # before the next tick (30 s), and far enough that a slow machine's sweep still comes first

    committed(sweep_once)
    committed(sweep_once)  # a second sweep (another beat, or the planned one early) plans nothing more

    assert len(sent) == 1 and sent[0]["who"] == "lease-expiry"
    assert 10 < sent[0]["countdown"] <= 20 + EXPIRY_MARGIN.total_seconds()
    lock = RunLock.objects.get(run_id=run.id)
    assert SweepPlan.objects.get().due_at == lock.expires_at + EXPIRY_MARGIN


def test_no_lease_or_one_that_expires_after_the_next_tick_plans_nothing(sent, committed):
    committed(sweep_once)
    assert sent == []  # an idle fleet: one read, no task

    run = make_run()
    expires_in(run, 45)
    assert committed(sweep_at_lease_expiry) is None and sent == []


def test_an_earlier_expiry_moves_the_plan_earlier_and_a_past_plan_is_replaced(sent, committed):
    late, early = make_run(), make_run()
    expires_in(late, 10)
    RunLock.objects.filter(run_id=early.id).delete()
    first = committed(sweep_at_lease_expiry)
    soon = timezone.now() + timedelta(seconds=5)
    RunLock.objects.create(run_id=early.id, owner="task:x", epoch=1, expires_at=soon, acquired_at=timezone.now())
    second = committed(sweep_at_lease_expiry)
    assert first is not None and second is not None and second < first and len(sent) == 2
    assert committed(sweep_at_lease_expiry) is None and len(sent) == 2  # planned already, no sooner

    SweepPlan.objects.update(due_at=timezone.now() - timedelta(seconds=1))  # the planned sweep came and went
    assert committed(sweep_at_lease_expiry) is not None and len(sent) == 3

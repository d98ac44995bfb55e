"""A rate limit's old window rows (RateSlot) are pruned by the sweep, not by the calls: a call's commit only counts
and takes its slot, and the window it counts is the same with or without the old rows."""

from datetime import timedelta
from uuid import uuid4

import pytest
from django.utils import timezone

from runs.models import RateSlot
from runs.rate_limits import rate_take
from runs.recovery import sweep_once
from tests.helpers import housekeeping_due

pytestmark = pytest.mark.django_db


def slot(seconds_ago: float, key: str = "llm:m") -> RateSlot:
    return RateSlot.objects.create(
        key=key, started_at=timezone.now() - timedelta(seconds=seconds_ago), run_id=uuid4(), step_key="k"
    )


def test_a_call_leaves_old_rows_alone_and_the_sweep_prunes_only_the_long_gone_ones(settings, monkeypatch):
    settings.PAL_RATE_LIMITS = {"llm:m": {"requests_per_minute": 2}}
    gone, left, gone_elsewhere = slot(600), slot(90), slot(300, key="llm:removed-from-settings")
    recent = slot(30)

    taken, full = rate_take(channel="llm", name="m", run_id=uuid4(), step_key="r:ask:1")

    assert full is None and len(taken) == 1  # the 30 s old call and this one: 2 in the window
    assert RateSlot.objects.filter(id__in=[gone.id, left.id, gone_elsewhere.id]).count() == 3  # no prune in the call
    _, full = rate_take(channel="llm", name="m", run_id=uuid4(), step_key="r:ask:2")
    assert full is not None and full["requests_per_minute"] == 2  # the old rows never counted

    housekeeping_due(monkeypatch)  # the pass prunes (once a minute per process)
    sweep_once()

    assert set(RateSlot.objects.values_list("id", flat=True)) == {left.id, recent.id, *taken}


def test_the_slot_ids_a_call_takes_are_its_own_rows_in_each_limit(settings):
    settings.PAL_RATE_LIMITS = {"llm:m": {"requests_per_minute": 5}, "llm:*": {"requests_per_minute": 5}}
    run_id = uuid4()

    taken, full = rate_take(channel="llm", name="m", run_id=run_id, step_key="r:ask:1")

    assert full is None
    rows = RateSlot.objects.filter(id__in=taken)
    assert sorted(rows.values_list("key", flat=True)) == ["llm:*", "llm:m"]
    assert set(rows.values_list("run_id", flat=True)) == {run_id}

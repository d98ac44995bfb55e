"""Hosts whose clocks disagree (issue 23 section 5): workers 40 s ahead and 40 s behind the database, and a beat
40 s behind, all under libfaketime, with no crash at all. Every lease, timer and window is judged by the
database's clock, so no live run is re-driven, a rate limit holds in real time and a timer fires on time."""

import json
import time

import pytest

from pal.clock import db_now
from runs.models import FINAL_STATUSES, Run, RunStatus
from tests.helpers import QUICK, describe, echo, events, sleep_tool, start_run
from tests.support.faketime import skewed
from tests.support.workers import start_beat, stop_beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

AHEAD, BEHIND = 40, -40


@pytest.fixture
def skewed_fleet(celery_workers, worker_env, tmp_path):
    """A worker 40 s ahead, one 40 s behind and a beat 40 s behind; extra env for all of them. Each worker has room
    for every run at once: a booking that waits for a busy fleet longer than its TTL is re-driven on any clock."""
    beats = []

    def start(env=None):
        env = env or {}
        celery_workers({**env, **skewed(AHEAD)}, name="ahead", concurrency=3, **QUICK)
        celery_workers({**env, **skewed(BEHIND)}, name="behind", concurrency=3, **QUICK)
        beats.append(start_beat({**worker_env, **env, **skewed(BEHIND)}, tmp_path / "beat"))

    yield start
    for beat in beats:
        stop_beat(beat)
        print((tmp_path / "beat" / "beat.log").read_text(errors="replace")[-3000:])


def redriven(runs) -> list:
    return [event for run in runs for event in events(run, "run_redriven")]


def test_skewed_workers_and_beat_redrive_no_live_run_and_wake_timers_on_time(skewed_fleet):
    skewed_fleet()
    timer = {"id": "nap", "kind": "sleep", "seconds": 3}
    runs = [
        start_run(echo("first"), sleep_tool("long", 3), timer, sleep_tool("after", 2), echo("last")) for _ in range(4)
    ]
    late: dict = {}  # run id -> seconds (by the database's clock) from its wake time to when it stopped waiting
    waking: dict = {}  # run id -> (its wake time, the database's clock when it was first seen waiting)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = list(Run.objects.filter(id__in=[run.id for run in runs]).values("id", "status", "wake_at"))
        now = db_now()
        for row in rows:
            if row["status"] == RunStatus.WAITING and row["wake_at"] is not None:
                waking.setdefault(row["id"], (row["wake_at"], now))
            elif row["id"] in waking and row["id"] not in late:
                late[row["id"]] = (now - waking[row["id"]][0]).total_seconds()
        if all(row["status"] in FINAL_STATUSES for row in rows):
            break
        time.sleep(0.05)

    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, describe(run)
    print(f"timers woke this late (real seconds after their wake time): {sorted(round(s, 2) for s in late.values())}")
    assert redriven(runs) == [], "\n".join(describe(run) for run in runs)
    assert len(late) == len(runs)
    # The wake time is the database's now + 3 s, whatever the skewed worker's clock said (never 40 s off) ...
    assert all((wake - seen).total_seconds() <= timer["seconds"] for wake, seen in waking.values()), waking
    # ... and no timer woke before it by the database's clock (a worker 40 s ahead would have woken it early).
    assert all(seconds >= 0 for seconds in late.values()), late


def test_a_rate_limit_holds_in_real_time_across_skewed_workers(skewed_fleet, llm_provider):
    skewed_fleet({**llm_provider.env(), "PAL_RATE_LIMITS": json.dumps({"llm:gpt-4o-mini": {"requests_per_minute": 2}})})
    step = {"id": "ask", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Q {{ item }}"}
    runs = [start_run({**step, "for_each": "{{ input.qs }}", "max_concurrency": 4}, input={"qs": [1, 2]}) for _ in "ab"]

    deadline = time.monotonic() + 150
    while not all(Run.objects.filter(id=run.id, status__in=FINAL_STATUSES).exists() for run in runs):
        assert time.monotonic() < deadline, "\n".join(describe(run) for run in runs)
        time.sleep(0.2)

    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, describe(run)
    times = sorted(call.received_at for call in llm_provider.calls)
    busiest = max(sum(1 for t in times if start <= t < start + 60) for start in times)
    print(f"calls arrived at (real s after the first): {[round(t - times[0], 1) for t in times]}")
    assert len(times) == 4 and len({call.idempotency_key for call in llm_provider.calls}) == 4
    assert busiest <= 2
    assert redriven(runs) == []

"""A workflow's concurrency limit on real workers (issue 14): 20 runs of one group with max_runs 2 on 2 workers never
have more than 2 running (from the journal's own intervals), all finish, they start in creation order, and a kill -9
of a worker while the group is at its limit loses nothing (its run keeps its slot until the sweep re-drives it)."""

import time

import pytest

from runs.models import FINAL_STATUSES, Run, RunStatus
from runs.recovery import sweep_once
from runs.services import run_create, workflow_create
from tests.helpers import QUICK, describe, events, sleep_tool

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

FAST_RECOVERY = {"PAL_LEASE_TTL": "3", "PAL_HEARTBEAT_INTERVAL": "1", "PAL_SLICE_SECONDS": "60"}


def most_running_at_once(runs: list[Run]) -> int:
    """From the journal: +1 at each run_started, -1 at each ending; the highest count on the way."""
    marks = []
    for run in runs:
        rows = events(run)
        started = next(e.created_at for e in rows if e.kind == "run_started")
        ended = next(e.created_at for e in rows if e.kind in ("run_succeeded", "run_failed", "run_cancelled"))
        marks += [(started, 1), (ended, -1)]
    most = now = 0
    for _at, change in sorted(marks, key=lambda m: (m[0], m[1])):  # an end before a start at the same instant
        now += change
        most = max(most, now)
    return most


def test_twenty_runs_of_one_group_never_run_more_than_two_at_once_even_through_a_kill(celery_workers):
    workflow_create(
        definition={
            "name": "per-customer",
            "concurrency": {"key": "{{ input.customer }}", "max_runs": 2},
            "steps": [sleep_tool("work", 0.4), sleep_tool("more", 0.4)],
        }
    )
    first = celery_workers(FAST_RECOVERY, name="limit-a", **QUICK)
    celery_workers(FAST_RECOVERY, name="limit-b", **QUICK)
    runs = [run_create(workflow_name="per-customer", input={"customer": "acme"})[0] for _ in range(20)]

    killed = False
    deadline = time.monotonic() + 240
    while True:
        running = Run.objects.filter(id__in=[r.id for r in runs], status=RunStatus.RUNNING).count()
        if not killed and running == 2 and Run.objects.filter(status=RunStatus.SUCCEEDED).count() >= 4:
            first.kill()  # SIGKILL while the group is at its limit
            killed = True
            celery_workers(FAST_RECOVERY, name="limit-c", **QUICK)
        sweep_once(who="test-beat")  # the beat's part: re-drives the killed worker's run once its lease expired
        if Run.objects.filter(id__in=[r.id for r in runs]).exclude(status__in=FINAL_STATUSES).count() == 0:
            break
        assert time.monotonic() < deadline, "\n".join(describe(r) for r in runs if r.status not in FINAL_STATUSES)
        time.sleep(0.25)

    assert killed
    for run in runs:
        run.refresh_from_db()
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}, [describe(r) for r in runs if r.status != "succeeded"]
    assert most_running_at_once(runs) == 2
    started = sorted(runs, key=lambda r: next(e.created_at for e in events(r) if e.kind == "run_started"))
    assert [r.id for r in started] == [r.id for r in runs]  # creation order

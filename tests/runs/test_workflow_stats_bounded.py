"""/workflows/ at any size (issue 15 section 4): every run of the last 24 hours is counted, over all a workflow's
versions, in the runs, the success rate, the percentiles and the cost (from hourly rollups: runs.workflow_rollups),
so the page reads as many rows with a million runs as with a thousand and samples none."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import workflow_stats
from runs.models import Run
from runs.services import workflow_create
from tests.helpers import drive_to_end, echo_step, make_run, tool_step

pytestmark = pytest.mark.django_db


def _ended(workflow, *, minutes_ago: int, seconds: int) -> Run:
    run = make_run(workflow=workflow)
    drive_to_end(run)
    created = timezone.now() - timedelta(minutes=minutes_ago)
    Run.objects.filter(id=run.id).update(
        created_at=created, started_at=created, finished_at=created + timedelta(seconds=seconds)
    )
    return run


def test_rates_and_percentiles_count_every_run_of_the_window_across_versions():
    ok = {"name": "bounded", "steps": [echo_step("only")]}
    v1 = workflow_create(definition=ok)
    v2 = workflow_create(definition={**ok, "steps": [tool_step("only", "test_fail")]})
    # Oldest first: two of v1 that succeeded (10 s, 20 s), then v2 (fails, 1 s), v1 (2 s), v2 (fails, 3 s).
    _ended(v1, minutes_ago=50, seconds=10)
    _ended(v1, minutes_ago=40, seconds=20)
    _ended(v2, minutes_ago=30, seconds=1)
    _ended(v1, minutes_ago=20, seconds=2)
    _ended(v2, minutes_ago=10, seconds=3)
    _ended(v1, minutes_ago=60 * 30, seconds=99)  # outside the 24 hours: not counted

    (summary,) = workflow_stats.workflow_summaries(names=["bounded"])

    assert summary["runs"] == 5  # every run of the window, both versions
    assert (summary["ended"], summary["succeeded"]) == (5, 3)
    assert summary["success_rate"] == pytest.approx(3 / 5)
    assert summary["p50_s"] == pytest.approx(3)  # of 1, 2, 3, 10 and 20 s (few runs: the durations themselves)
    assert summary["p95_s"] == pytest.approx(workflow_stats.percentile([1, 2, 3, 10, 20], 0.95))
    assert summary["cost_runs"] == 5

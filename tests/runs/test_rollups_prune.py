"""/workflows/' hourly rollup rows (runs.workflow_rollups) are pruned by the sweep once they are older than what any
page reads plus a margin (KEEP, 8 days), a bounded batch per pass, the oldest first; the mark's `since` moves with
them, and the figures /workflows/ shows are the same before and after."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import workflow_rollups
from runs.models import WorkflowHourRollup, WorkflowRollupMark
from runs.recovery import sweep_once
from runs.workflow_rollups import KEEP, rollups_prune, window_figures
from tests.helpers import drive_to_end, echo_step, housekeeping_due, make_run, make_workflow

pytestmark = pytest.mark.django_db


def hour(hours_ago: int):
    return workflow_rollups._hour(timezone.now()) - timedelta(hours=hours_ago)


def row(name: str, hours_ago: int, created: int = 1) -> WorkflowHourRollup:
    return WorkflowHourRollup.objects.create(name=name, hour=hour(hours_ago), created=created, ended={}, histogram=[])


def hours_left(name: str) -> list:
    return sorted(WorkflowHourRollup.objects.filter(name=name).values_list("hour", flat=True))


def test_the_sweep_prunes_rows_past_the_margin_and_keeps_every_hour_a_page_reads(monkeypatch):
    workflow = make_workflow(steps=[echo_step("only")], name="pruned")
    for _ in range(3):
        drive_to_end(make_run(workflow=workflow))
    now = timezone.now()
    before = window_figures(names=["pruned"], now=now)  # the first read makes the mark (and its rows)
    keep_hours = int(KEEP / timedelta(hours=1))
    old = [row("pruned", keep_hours + 30), row("pruned", keep_hours + 1)]
    kept = [row("pruned", keep_hours), row("pruned", 48), row("pruned", 30)]
    WorkflowRollupMark.objects.filter(id=1).update(since=hour(keep_hours + 40))

    housekeeping_due(monkeypatch)  # the pass prunes (once a minute per process)
    sweep_once()

    assert not WorkflowHourRollup.objects.filter(id__in=[r.id for r in old]).exists()
    assert set(WorkflowHourRollup.objects.filter(id__in=[r.id for r in kept]).values_list("id", flat=True)) == {
        r.id for r in kept
    }
    assert WorkflowRollupMark.objects.get(id=1).since == hour(keep_hours)  # the mark claims no pruned hour
    after = window_figures(names=["pruned"], now=now)["pruned"]
    assert (after.created, after.ended) == (before["pruned"].created, before["pruned"].ended) == (3, {"succeeded": 3})


def test_one_pass_deletes_at_most_a_batch_the_oldest_first_and_nothing_when_nothing_is_old():
    keep_hours = int(KEEP / timedelta(hours=1))
    for hours_ago in (keep_hours + 5, keep_hours + 4, keep_hours + 3, keep_hours + 2, keep_hours + 1):
        row("a", hours_ago)
    recent = row("a", 2)

    assert rollups_prune(batch=2) == 2
    assert hours_left("a") == [hour(keep_hours + 3), hour(keep_hours + 2), hour(keep_hours + 1), recent.hour]
    assert rollups_prune(batch=2) == 2
    assert rollups_prune(batch=2) == 1
    assert rollups_prune(batch=2) == 0
    assert hours_left("a") == [recent.hour]

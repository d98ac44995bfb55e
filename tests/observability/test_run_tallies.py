"""/metrics' run counters from runs.tallies: the runs before the mark are counted once into tallies, a scrape adds
the runs since, and the totals are what one GROUP BY over every run would say (issue 15 section 4: flat at scale)."""

from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from runs import services, tallies
from runs.models import FINAL_STATUSES, Run, RunStatus, RunTally, RunTallyMark
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, tool_step

pytestmark = pytest.mark.django_db


def _age(run: Run, *, hours: float, status: str | None = None) -> None:
    """Move a run's creation, and its ending when it has one (or is given one), `hours` into the past."""
    when = timezone.now() - timedelta(hours=hours)
    changes = {"created_at": when}
    if status is not None:
        changes["status"] = status
    if status in FINAL_STATUSES or run.status in FINAL_STATUSES:
        changes["finished_at"] = when + timedelta(seconds=5)
    Run.objects.filter(id=run.id).update(**changes)
    run.refresh_from_db()


def _grouped() -> tuple[dict, dict]:
    """What the old /metrics read: one GROUP BY over every run."""
    created, ended = {}, {}
    for name, status, n in Run.objects.order_by().values_list("workflow__name", "status").annotate(n=Count("id")):
        created[name] = created.get(name, 0) + n
        if status in FINAL_STATUSES:
            ended[(name, status)] = n
    return created, ended


def test_runs_before_and_after_the_mark_are_each_counted_once():
    workflow = make_workflow(steps=[echo_step("only")])
    for status in ("succeeded", "succeeded", "failed"):
        _age(make_run(workflow=workflow), hours=3, status=status)

    created, ended = tallies.run_counts()

    # The first scrape set the mark and counted the three old runs into tallies.
    mark = RunTallyMark.objects.get(id=1)
    assert mark.upto is not None and mark.upto < timezone.now() - tallies.LAG + timedelta(seconds=5)
    kept = {t.status: t.n for t in RunTally.objects.filter(workflow=workflow)}
    assert kept == {tallies.CREATED: 3, "succeeded": 2, "failed": 1}
    assert created == {workflow.name: 3}
    assert ended == {(workflow.name, "succeeded"): 2, (workflow.name, "failed"): 1}

    # New runs after the mark: one queued, one that ends; the totals are the whole table's, the tallies unchanged.
    make_run(workflow=workflow)
    drive_to_end(make_run(workflow=workflow))
    created, ended = tallies.run_counts()
    assert (created, ended) == _grouped()
    assert created[workflow.name] == 5 and ended[(workflow.name, "succeeded")] == 3
    assert {t.status: t.n for t in RunTally.objects.filter(workflow=workflow)} == kept
    assert tallies.tally_advance() is False  # the mark is fresh: nothing to move

    # Two hours on, a scrape moves the mark past every run: all of them in tallies now, the totals the same.
    later = timezone.now() + timedelta(hours=2)
    assert tallies.tally_advance(now=later) is True
    assert RunTallyMark.objects.get(id=1).upto == later - tallies.LAG
    assert {t.status: t.n for t in RunTally.objects.filter(workflow=workflow)} == {
        tallies.CREATED: 5,
        "succeeded": 3,
        "failed": 1,
    }
    assert tallies.run_counts(now=later) == (created, ended)


def test_every_version_of_a_workflow_counts_under_its_name():
    first = make_workflow(steps=[echo_step("only")])
    second = services.workflow_create(definition={"name": first.name, "steps": [echo_step("only"), echo_step("two")]})
    _age(make_run(workflow=first), hours=3, status="succeeded")
    drive_to_end(make_run(workflow=second))

    created, ended = tallies.run_counts()

    assert created == {first.name: 2}
    assert ended == {(first.name, "succeeded"): 2}


def test_a_retried_run_that_fails_again_counts_two_endings_and_no_counter_goes_down():
    workflow = make_workflow(steps=[tool_step("refuse", "test_fail")])
    run = make_run(workflow=workflow)
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    _age(run, hours=3)
    assert tallies.run_counts() == ({workflow.name: 1}, {(workflow.name, "failed"): 1})

    services.run_retry(run_id=run.id, by="alice", reason="try again")
    # Running again: its first ending stays counted (a counter), and it is still one run created.
    assert tallies.run_counts() == ({workflow.name: 1}, {(workflow.name, "failed"): 1})

    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert tallies.run_counts() == ({workflow.name: 1}, {(workflow.name, "failed"): 2})

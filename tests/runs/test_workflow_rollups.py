"""/workflows/' hourly rollups (runs.workflow_rollups) against the runs themselves: the figures read from the rows and
the runs since the mark are the ones counted directly from the runs (percentiles within a bucket once the rows keep
only the histogram), a run that ends after the mark is counted once whether it is read as recent or folded in later,
and two reads that race to move the mark count every run once (one folds, the other reads)."""

import math
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from journal.models import JournalEvent
from runs import workflow_rollups, workflow_stats
from runs.models import FINAL_STATUSES, Run, RunStatus, WorkflowHourRollup, WorkflowRollupMark
from runs.services import run_cancel, workflow_create
from tests.helpers import drive_to_end, make_run, tool_step

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
PRICED = {"name": "priced", "steps": [{"id": "ask", **LLM, "prompt": "Say {{ input.n }}"}, tool_step("act", "echo")]}
FAILING = {"name": "priced", "steps": [tool_step("act", "test_fail")]}


def _place(run: Run, *, created_ago: timedelta, seconds: float | None) -> None:
    """Move a run back in time: created `created_ago` ago, ended `seconds` after it started (None: never started)."""
    created = timezone.now() - created_ago
    started = created if seconds is not None else None
    finished = created + timedelta(seconds=seconds or 0)
    Run.objects.filter(id=run.id).update(created_at=created, started_at=started, finished_at=finished)


def _direct(name: str, *, now) -> dict:
    """The window's figures counted from the runs and their journal, as the page promises them."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    runs = list(Run.objects.filter(workflow__name=name, created_at__gte=start, created_at__lt=now))
    ended = [r for r in runs if r.status in FINAL_STATUSES]
    seconds = [(r.finished_at - r.started_at).total_seconds() for r in ended if r.started_at]
    cost = sum(
        e.payload["output"].get("cost_usd", 0)
        for e in JournalEvent.objects.filter(run_id__in=[r.id for r in ended], kind="step_completed", step_id="ask")
    )
    succeeded = sum(1 for r in ended if r.status == RunStatus.SUCCEEDED)
    return {
        "runs": len(runs),
        "ended": len(ended),
        "succeeded": succeeded,
        "p50_s": workflow_stats.percentile(seconds, 0.5),
        "p95_s": workflow_stats.percentile(seconds, 0.95),
        "cost_per_run": cost / len(ended),
    }


def _fleet() -> list[Run]:
    """Runs of two versions of "priced" over the last day: succeeded ones with a model call (its cost in the
    journal) and durations from 5 ms to 4 minutes, failed ones, one cancelled before it started, one still queued,
    one from two days ago, and some that ended in the last minutes (after any mark)."""
    v1 = workflow_create(definition=PRICED)
    v2 = workflow_create(definition=FAILING)
    made = []
    for number in range(24):
        run = make_run(workflow=v1 if number % 4 else v2, input={"n": number})
        drive_to_end(run)
        seconds = 0.005 * 1.6**number
        _place(run, created_ago=timedelta(hours=number % 20, minutes=15 + number), seconds=seconds)
        made.append(run)
    for number in range(3):  # ended within the last LAG: newer than the mark
        run = make_run(workflow=v1, input={"n": 100 + number})
        drive_to_end(run)
        _place(run, created_ago=workflow_rollups.LAG / 2, seconds=1 + number)
        made.append(run)
    cancelled = make_run(workflow=v1)
    run_cancel(run_id=cancelled.id, by="otto", reason="not needed")
    _place(cancelled, created_ago=timedelta(hours=3), seconds=None)
    make_run(workflow=v1)  # queued: counted as created, not as ended
    old = make_run(workflow=v1)
    drive_to_end(old)
    _place(old, created_ago=timedelta(days=2), seconds=5)
    return made


def _assert_matches(summary: dict, direct: dict) -> None:
    assert (summary["runs"], summary["ended"], summary["succeeded"]) == (
        direct["runs"],
        direct["ended"],
        direct["succeeded"],
    )
    assert summary["cost_per_run"] == pytest.approx(direct["cost_per_run"])
    for key in ("p50_s", "p95_s"):  # within one bucket of percentile_cont over the durations
        assert abs(math.log(summary[key] / direct[key])) <= math.log(workflow_rollups.RATIO), key


@pytest.mark.django_db
def test_figures_from_the_rollups_equal_the_figures_counted_from_the_runs(monkeypatch):
    monkeypatch.setattr(workflow_rollups, "EXACT_UP_TO", 0)  # the rows keep only the histogram
    _fleet()
    now = timezone.now()

    (summary,) = workflow_stats.workflow_summaries(names=["priced"], now=now)

    direct = _direct("priced", now=now)
    assert direct["runs"] == 29 and direct["ended"] == 28 and direct["cost_per_run"] > 0
    assert 0 < direct["succeeded"] < direct["ended"]
    _assert_matches(summary, direct)
    rolled = WorkflowHourRollup.objects.filter(name="priced")
    assert sum(row.created for row in rolled) == 29 - 3 - 1  # those made in the last minutes are read as recent
    assert all(row.durations is None for row in rolled)


@pytest.mark.django_db
def test_figures_are_exact_while_the_rows_keep_the_durations():
    _fleet()
    now = timezone.now()

    (summary,) = workflow_stats.workflow_summaries(names=["priced"], now=now)

    direct = _direct("priced", now=now)
    assert summary["p50_s"] == pytest.approx(direct["p50_s"])
    assert summary["p95_s"] == pytest.approx(direct["p95_s"])
    assert summary["success_rate"] == pytest.approx(direct["succeeded"] / direct["ended"])


@pytest.mark.django_db
def test_a_run_that_ends_after_the_mark_is_counted_once_before_and_after_the_mark_passes_it():
    workflow = workflow_create(definition=PRICED)
    first = make_run(workflow=workflow, input={"n": 1})
    drive_to_end(first)
    _place(first, created_ago=timedelta(hours=1), seconds=2)
    now = timezone.now()
    (before,) = workflow_stats.workflow_summaries(names=["priced"], now=now)
    assert (before["runs"], before["ended"]) == (1, 1)
    mark = WorkflowRollupMark.objects.get()

    late = make_run(workflow=workflow, input={"n": 2})  # created and ended after the mark
    drive_to_end(late)
    assert late.finished_at > mark.upto
    (recent,) = workflow_stats.workflow_summaries(names=["priced"], now=now)
    later = now + workflow_rollups.LAG + workflow_rollups.STEP + timedelta(minutes=1)
    (folded,) = workflow_stats.workflow_summaries(names=["priced"], now=later)

    assert (recent["runs"], recent["ended"], recent["succeeded"]) == (2, 2, 2)
    assert WorkflowRollupMark.objects.get().upto > late.finished_at  # the mark moved past it: it is in the rows now
    assert (folded["runs"], folded["ended"], folded["succeeded"]) == (2, 2, 2)
    assert folded["cost_per_run"] == pytest.approx(recent["cost_per_run"])
    assert sum(row.created for row in WorkflowHourRollup.objects.filter(name="priced")) == 2


@pytest.mark.django_db(transaction=True)
def test_two_reads_racing_to_move_the_mark_count_each_run_once():
    _fleet()
    now = timezone.now()
    direct = _direct("priced", now=now)
    barrier = threading.Barrier(2)
    moved, summaries, errors = [], [], []

    def read() -> None:
        try:
            barrier.wait(timeout=30)
            moved.append(workflow_rollups.rollup_advance(now=now))
            summaries.append(workflow_stats.workflow_summaries(names=["priced"], now=now)[0])
        except Exception as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors and len(summaries) == 2
    assert sorted(moved) == [False, True]  # one folded, the other read with what it found
    for summary in summaries:
        _assert_matches(summary, direct)
        assert summary["p50_s"] == pytest.approx(direct["p50_s"])  # few runs: exact
    rows = WorkflowHourRollup.objects.filter(name="priced")
    folded = sum(sum(row.ended.values()) for row in rows)
    assert folded == direct["ended"] - 3  # every ended run but the three of the last minutes, once

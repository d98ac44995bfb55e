"""The ops dashboard's counts by status: exact for unfinished runs, exact for finished ones up to a bound, an
estimate past it (so a million finished runs cost the page nothing)."""

import re

import pytest
from django.db import connection

from runs import selectors
from runs.models import Run, RunStatus
from tests.helpers import echo_step, make_run, make_workflow

from .conftest import htmx

pytestmark = pytest.mark.django_db

MADE = {
    RunStatus.QUEUED: 3,
    RunStatus.RUNNING: 2,
    RunStatus.WAITING: 4,
    RunStatus.SUCCEEDED: 5,
    RunStatus.FAILED: 1,
    RunStatus.CANCELLED: 0,
}


def runs_in_each_status() -> None:
    workflow = make_workflow(steps=[echo_step("a")])
    for status, n in MADE.items():
        for _ in range(n):
            run = make_run(workflow=workflow)
            Run.objects.filter(id=run.id).update(status=status)


def shown_counts(page: str) -> dict[str, str]:
    return dict(re.findall(r'status-(\w+)">\w+</span><strong>([^<]*)</strong>', page))


def test_the_dashboard_counts_the_runs_of_each_status_exactly(viewer):
    runs_in_each_status()
    fragment = viewer.get("/ops/", headers=htmx("ops-counts")).content.decode()
    assert shown_counts(fragment) == {status: str(n) for status, n in MADE.items()}
    page = viewer.get("/ops/").content.decode()
    assert shown_counts(page) == {status: str(n) for status, n in MADE.items()}


def test_past_the_bound_a_finished_status_shows_an_estimate_and_live_ones_stay_exact(viewer, monkeypatch):
    runs_in_each_status()
    monkeypatch.setattr(selectors.ops, "EXACT_FINISHED_UP_TO", 3)  # where status_counts reads it
    counts = selectors.status_counts()

    assert {s: counts[s]["n"] for s in ("queued", "running", "waiting", "failed")} == {
        "queued": 3,
        "running": 2,
        "waiting": 4,
        "failed": 1,
    }
    assert all(counts[s]["exact"] for s in ("queued", "running", "waiting", "failed", "cancelled"))
    succeeded = counts["succeeded"]
    assert not succeeded["exact"]
    if connection.vendor == "postgresql":
        assert succeeded["n"] >= 4 and succeeded["shown"] == f"≈ {succeeded['n']:,}"
    else:
        assert succeeded["shown"] == "3+"
    fragment = viewer.get("/ops/", headers=htmx("ops-counts")).content.decode()
    assert shown_counts(fragment)["succeeded"] == succeeded["shown"]
    assert shown_counts(fragment)["waiting"] == "4"


def test_two_finished_statuses_past_the_bound_are_both_estimated(viewer, monkeypatch):
    runs_in_each_status()
    monkeypatch.setattr(selectors.ops, "EXACT_FINISHED_UP_TO", 0)  # succeeded and failed both pass it
    counts = selectors.status_counts()
    assert not counts["succeeded"]["exact"] and not counts["failed"]["exact"]
    if connection.vendor == "postgresql":  # one EXPLAIN of a UNION ALL of the two
        assert counts["succeeded"]["shown"].startswith("≈") and counts["failed"]["shown"].startswith("≈")
    assert viewer.get("/ops/").status_code == 200


def test_the_counts_are_one_query_while_no_finished_status_passes_the_bound(db, django_assert_num_queries):
    runs_in_each_status()
    with django_assert_num_queries(1):
        selectors.status_counts()

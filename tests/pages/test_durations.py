"""One duration, one way of writing it: the run page, the runs list and /ops/ show the same string for the same
span (runs.pages.formatting.duration_text, through the runs_pages filters and the views)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, Sweep
from tests.helpers import drive_to_end, echo_step, make_run

pytestmark = pytest.mark.django_db


def a_run_that_took(seconds: float) -> Run:
    run = make_run(steps=[echo_step("a")])
    drive_to_end(run)
    started = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(id=run.id).update(started_at=started, finished_at=started + timedelta(seconds=seconds))
    return run


def list_row_took(page: str, run: Run) -> str:
    row = re.search(rf'<tr class="run-row"[^>]*data-run="{run.id}">(.*?)</tr>', page, re.S)
    assert row, "the run's row is on the list"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    return cells[5].strip()  # id, workflow, status, parent, created, took, state


@pytest.mark.parametrize(("seconds", "text"), [(1.5, "1.5 s"), (0.25, "250 ms"), (125, "2 min 5 s")])
def test_the_run_page_and_the_runs_list_write_a_runs_duration_the_same_way(viewer, seconds, text):
    run = a_run_that_took(seconds)
    header = viewer.get(f"/runs/{run.id}/").content.decode()
    assert f"ran {text}" in header
    assert list_row_took(viewer.get("/runs/").content.decode(), run) == text


def test_the_ops_page_writes_a_sweeps_duration_as_the_run_pages_do(viewer):
    run = a_run_that_took(1.5)
    now = timezone.now()
    Sweep.objects.create(started_at=now - timedelta(seconds=3), finished_at=now - timedelta(seconds=1.5), who="beat")
    ops = viewer.get("/ops/").content.decode()
    assert "<td>1.5 s</td>" in ops
    assert "ran 1.5 s" in viewer.get(f"/runs/{run.id}/").content.decode()

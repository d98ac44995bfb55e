"""The run page's waterfall of a graph (issue 12), driven inline: parallel steps on rows of their own naming what
they need, a for_each step's items under it (folded past two dozen), a skipped step's row, and what
journal.selectors.waterfall_bars folds for a for_each step that fails and is retried."""

import pytest

from journal.selectors import waterfall_bars
from runs.errors import StepError
from runs.models import RunStatus
from runs.services import run_retry
from runs.steps.tools import tool
from tests.helpers import _first_time, drive_to_end, make_run, step_events, tool_step

from .conftest import htmx

pytestmark = pytest.mark.django_db


@tool("test_waterfall_fail_once")
def fail_once(args, ctx):
    """Fails definitely the first time it runs with {"fail": true}; returns its args otherwise."""
    if args.get("fail") and _first_time(ctx):
        raise StepError("asked to fail", code="test_refused")
    return args


def body(response) -> str:
    return response.content.decode()


def graph_run(items: int):
    run = make_run(
        steps=[
            tool_step("plan", "echo", {"n": 1}),
            tool_step("web", "sleep", {"seconds": 0.05}, needs=["plan"]),
            tool_step("papers", "sleep", {"seconds": 0.05}, needs=["plan"]),
            tool_step("mail", "echo", {}, needs=["plan"], when="steps.plan.output.n == 2"),
            tool_step("read", "echo", {"i": "{{ index }}"}, needs=["web", "papers"], for_each="{{ input.items }}"),
        ],
        input={"items": list(range(items))},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    return run


def test_a_graphs_waterfall_names_each_steps_needs_and_shows_the_skipped_step_with_its_when(viewer):
    run = graph_run(3)
    fragment = body(viewer.get(f"/runs/{run.id}/", headers=htmx("waterfall")))

    assert '<span class="mono">web</span> <span class="kind">tool_call</span> <span class="wf-needs">← plan</span>' in (
        fragment
    )
    assert '<span class="wf-needs">← web, papers</span>' in fragment
    assert '<div class="wf-row wf-skipped"><div class="wf-label" title="mail needs plan"><span class="mono">mail' in (
        fragment
    )
    assert "skipped: steps.plan.output.n == 2 → false" in fragment
    assert "3 items: 3 done</span>" in fragment or "<i>3 items: 3 done · " in fragment  # beside or in its bar
    assert fragment.count('<div class="wf-row wf-item">') == 3
    assert "wf-items" not in fragment


def test_thirty_items_are_folded_behind_show_all(viewer):
    run = graph_run(30)
    page = body(viewer.get(f"/runs/{run.id}/"))
    fold = page.index('<details class="wf-items"><summary>show all 30 items of read (25 more, all completed)')
    assert page[:fold].count('<div class="wf-row wf-item">') == 5
    assert page.count('<div class="wf-row wf-item">') == 30
    assert "skipped" in page.split('id="waterfall-card"')[1].split("</h2>")[0]  # the legend says what the ring is


def test_a_for_each_bar_spans_its_items_fails_with_its_item_and_reopens_when_the_item_is_retried():
    run = make_run(
        steps=[
            tool_step("fan", "test_waterfall_fail_once", {"fail": "{{ item }}"}, for_each="{{ input.items }}"),
        ],
        input={"items": [False, True, False]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    (fan,) = [b for b in waterfall_bars(run_id=run.id) if b["step_id"] == "fan"]
    assert (fan["status"], fan["items"]) == ("failed", 3)
    assert fan["ended_at"] == step_events(run, "run_failed")[0].created_at  # spans its items to the run's end

    run_retry(run_id=run.id, by="otto", reason="the item again")
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    bars = waterfall_bars(run_id=run.id)
    assert [(b["status"], b["cached"]) for b in bars if b["step_id"] == "fan"] == [
        ("failed", False),
        ("completed", False),  # reopened at the retry, completed with its items
    ]
    assert [b["attempt"] for b in bars if b["step_id"] == "fan[1]"] == [1, 2]
    assert all(b["items"] is None for b in bars if b["step_id"] != "fan")

"""The waterfall's layout (runs.waterfall): pure functions of the bars and markers, checked against the positions,
widths and labels they compute. No database: the run is an unsaved Run, the bars and markers are the dicts
runs.selectors.run_waterfall and journal.selectors.waterfall_markers return."""

import uuid
from datetime import UTC, datetime, timedelta

from runs import waterfall
from runs.models import Run, RunStatus

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
RUN_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def a_run(status=RunStatus.SUCCEEDED, *, finished: float | None = 10.0) -> Run:
    return Run(
        id=RUN_ID,
        status=status,
        created_at=T0,
        started_at=T0,
        finished_at=at(finished) if finished is not None else None,
    )


def bar(step_id="a", *, start=1.0, end: float | None = 3.0, status="succeeded", attempt=1, **extra) -> dict:
    return {
        "step_id": step_id,
        "kind": "tool_call",
        "attempt": attempt,
        "status": status,
        "started_at": at(start),
        "ended_at": at(end) if end is not None else None,
        "cached": False,
        "child_run_id": None,
        **extra,
    }


def marker(kind: str, seconds: float, *, step_id="a", attempt=1, **extra) -> dict:
    return {
        "seq": 0,
        "kind": kind,
        "step_id": step_id,
        "attempt": attempt,
        "at": at(seconds),
        "by": None,
        "why": None,
        "force": False,
        "waiting_on": None,
        "message": None,
        **extra,
    }


def test_percent_is_the_share_of_the_axis_clamped_to_its_ends():
    assert waterfall.percent(at(2.5), T0, 10.0) == 25.0
    assert waterfall.percent(at(-1), T0, 10.0) == 0.0
    assert waterfall.percent(at(11), T0, 10.0) == 100.0


def test_the_axis_of_an_ended_run_spans_its_creation_to_its_last_moment():
    run = a_run()
    start, end = waterfall.time_axis(run, [bar(start=1, end=3), bar("b", start=3, end=7)], [], now=at(60))
    assert (start, end) == (T0, at(7))


def test_the_axis_of_a_live_run_reaches_now():
    run = a_run(RunStatus.RUNNING, finished=None)
    assert waterfall.time_axis(run, [bar(start=1, end=3)], [], now=at(20)) == (T0, at(20))
    assert waterfall.run_end(run, now=at(20)) == at(20)


def test_a_bar_sits_at_its_start_and_is_as_wide_as_it_took():
    segment = waterfall.bar_segment(a_run(), bar(start=1, end=3), start=T0, span=10.0, until=at(10))
    assert (segment["left"], segment["width"], segment["label"]) == ("10.000", "20.000", "2.0 s")
    assert segment["title"] == (f"a · attempt 1 · succeeded · 12:00:01.000 → 12:00:03.000 · 2.0 s · key {RUN_ID}:a:1")


def test_a_running_attempt_reaches_the_runs_end_and_one_without_an_outcome_has_no_width():
    running = waterfall.bar_segment(
        a_run(), bar(start=5, end=None, status="running"), start=T0, span=10.0, until=at(10)
    )
    assert (running["left"], running["width"], running["label"]) == ("50.000", "50.000", "5.0 s")
    lost = waterfall.bar_segment(a_run(), bar(start=5, end=None, status="failed"), start=T0, span=10.0, until=at(10))
    assert (lost["left"], lost["width"], lost["label"]) == ("50.000", "0.000", "no outcome")


def test_a_step_reused_by_a_redrive_has_no_label_and_says_so():
    cached = waterfall.bar_segment(a_run(), bar(cached=True), start=T0, span=10.0, until=at(10))
    assert cached["label"] == ""
    assert "reused from the journal by the re-drive at 12:00:01.000 (no call)" in cached["title"]


def test_lanes_follow_the_order_steps_first_ran_and_keep_every_attempt_and_each_child_once():
    child = uuid.uuid4()
    bars = [
        bar("b", start=0, end=1),
        bar("a", start=1, end=2, status="failed", child_run_id=child),
        bar("a", start=2, end=4, attempt=2, child_run_id=child),
    ]
    lanes = waterfall.step_lanes(a_run(), bars, start=T0, span=10.0, until=at(10))
    assert list(lanes) == ["b", "a"]
    assert [(b["attempt"], b["left"], b["width"]) for b in lanes["a"]["bars"]] == [
        (1, "10.000", "10.000"),
        (2, "20.000", "20.000"),
    ]
    assert lanes["a"]["children"] == [child]


def test_a_wait_runs_from_waiting_to_resumed_and_an_open_one_to_the_runs_end():
    lanes = waterfall.step_lanes(
        a_run(), [bar("a", start=0, end=1), bar("b", start=1, end=2)], start=T0, span=10.0, until=at(10)
    )
    markers = [
        marker("run_waiting", 2, waiting_on="approval"),
        marker("run_resumed", 4, by="otto", why="looks fine"),
        marker("run_waiting", 6, step_id="b", waiting_on="signal"),
    ]
    lines = waterfall.place_markers(markers, lanes, start=T0, span=10.0, until=at(10))
    assert lines == []
    assert lanes["a"]["waits"] == [
        {
            "left": "20.000",
            "width": "20.000",
            "title": "waiting on approval from 12:00:02.000; resumed at 12:00:04.000 by otto: looks fine",
        }
    ]
    assert lanes["b"]["waits"] == [
        {"left": "60.000", "width": "40.000", "title": "waiting on signal from 12:00:06.000; still waiting"}
    ]


def test_redrives_retries_and_the_end_are_lines_and_backoffs_are_ticks_in_their_lane():
    lanes = waterfall.step_lanes(a_run(), [bar("a", start=0, end=1)], start=T0, span=10.0, until=at(10))
    markers = [
        marker("run_backoff", 1),
        marker("run_redriven", 5, by="otto", why="worker died", force=True),
        marker("run_retried", 7, attempt=2, by="otto", why="fixed"),
        marker("run_succeeded", 10),
        marker("run_backoff", 3, step_id="unknown-step"),  # no lane: dropped
    ]
    lines = waterfall.place_markers(markers, lanes, start=T0, span=10.0, until=at(10))
    assert lines == [
        {"left": "50.000", "kind": "redrive", "title": "re-driven (forced) at 12:00:05.000 by otto: worker died"},
        {"left": "70.000", "kind": "retry", "title": "retried (step a attempt 2) at 12:00:07.000 by otto: fixed"},
        {"left": "100.000", "kind": "end", "title": "succeeded at 12:00:10.000"},
    ]
    assert lanes["a"]["ticks"] == [
        {"left": "10.000", "kind": "run_backoff", "title": "12:00:01.000 back-off before the next attempt"}
    ]


def test_the_scale_labels_the_start_then_the_time_since_it():
    assert waterfall.scale_ticks(T0, at(10)) == [
        {"left": "0", "label": "12:00:00.000"},
        {"left": "25", "label": "+2.5 s"},
        {"left": "50", "label": "+5.0 s"},
        {"left": "75", "label": "+7.5 s"},
        {"left": "100", "label": "+10.0 s"},
    ]


def test_an_axis_written_for_a_child_reads_back_and_a_bad_one_reads_as_none():
    assert waterfall.parse_axis(waterfall.format_axis(T0, at(10))) == (T0, at(10))
    assert waterfall.parse_axis("not,a-number") is None
    assert waterfall.parse_axis("1,2,3") is None
    assert waterfall.parse_axis(None) is None


def test_a_nested_child_is_laid_out_on_its_parents_axis():
    layout = waterfall.waterfall_layout(a_run(), [bar(start=1, end=3)], [], now=at(60), axis=(T0, at(20)))
    assert (layout["start"], layout["end"], layout["empty"]) == (T0, at(20), False)
    assert layout["rows"][0]["bars"][0]["left"] == "5.000"
    assert layout["rows"][0]["bars"][0]["width"] == "10.000"
    assert layout["ticks"][4]["label"] == "+20.0 s"


def test_a_run_of_one_instant_still_has_an_axis_to_divide_by():
    run = a_run(finished=0)
    layout = waterfall.waterfall_layout(run, [bar(start=0, end=0)], [], now=T0)
    assert layout["rows"][0]["bars"][0]["left"] == "0.000"
    assert layout["empty"] is False


def test_the_rows_html_escapes_what_came_from_the_journal():
    layout = waterfall.waterfall_layout(a_run(), [bar("<script>", start=1, end=3, attempt=2)], [], now=at(60))
    html = layout["rows_html"]
    assert "<script>" not in html
    assert '<span class="mono">&lt;script&gt;</span>' in html
    assert '<span class="wf-bar bar-succeeded" style="left:33.333%;width:66.667%"' in html  # axis: 0 s to 3 s
    assert "<i>#2 2.0 s</i>" in html

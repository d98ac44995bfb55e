"""The waterfall's layout (runs.pages.waterfall): pure functions of the bars and markers, checked against the positions,
widths and labels they compute. No database: the run is an unsaved Run, the bars and markers are the dicts
runs.selectors.run_waterfall and journal.selectors.waterfall_markers return."""

import uuid
from datetime import UTC, datetime, timedelta

from runs.models import Run, RunStatus
from runs.pages import waterfall

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
    assert '<span class="wf-bar bar-succeeded" data-l="33.333" data-w="66.667"' in html  # axis: 0 s to 3 s
    assert "<i>#2 2.0 s</i>" in html


# --- graphs: parallel rows, needs, items, skipped steps ------------------------------------------------------------

DIAMOND = [
    {"id": "top", "kind": "tool_call"},
    {"id": "left", "kind": "tool_call", "needs": ["top"]},
    {"id": "right", "kind": "tool_call", "needs": ["top"]},
    {"id": "bottom", "kind": "tool_call", "needs": ["left", "right"]},
]


def rows_of(layout) -> list[str]:
    return [row["step_id"] for row in layout["rows"]]


def item_bars(step_id: str, count: int, *, start=1.0, status="completed", **by_index) -> list[dict]:
    """A for_each step's bar (spanning its items) then one bar per item; by_index: {"i3": "failed"}."""
    bars = [bar(step_id, start=start, end=start + 2, status="completed", items=count)]
    for index in range(count):
        state = by_index.get(f"i{index}", status)
        end = None if state in ("running", "waiting") else start + 1
        bars.append(bar(f"{step_id}[{index}]", start=start, end=end, status=state))
    return bars


def test_steps_that_run_at_the_same_time_are_on_rows_of_their_own_and_each_names_the_steps_it_needs():
    bars = [
        bar("top", start=0, end=1),
        bar("left", start=1, end=4),
        bar("right", start=1, end=3),  # overlaps left
        bar("bottom", start=4, end=5),
    ]
    layout = waterfall.waterfall_layout(a_run(), bars, [], now=at(60), steps=DIAMOND)

    assert rows_of(layout) == ["top", "left", "right", "bottom"]
    assert [len(row["bars"]) for row in layout["rows"]] == [1, 1, 1, 1]  # never two steps' bars in one row
    assert [row["needs"] for row in layout["rows"]] == [[], ["top"], ["top"], ["left", "right"]]
    html = layout["rows_html"]
    assert '<span class="wf-needs">← left, right</span>' in html
    assert 'title="bottom needs left, right"' in html


def test_a_step_without_needs_in_a_graph_needs_the_step_listed_just_before_it():
    steps = [{"id": "a"}, {"id": "b", "needs": []}, {"id": "c"}]
    bars = [bar("a", start=0, end=1), bar("b", start=0, end=1), bar("c", start=1, end=2)]
    layout = waterfall.waterfall_layout(a_run(), bars, [], now=at(60), steps=steps)
    assert [row["needs"] for row in layout["rows"]] == [[], [], ["b"]]


def test_a_plain_list_names_no_needs_and_its_rows_read_as_before():
    steps = [{"id": "a"}, {"id": "b"}]
    layout = waterfall.waterfall_layout(
        a_run(), [bar("a", start=0, end=1), bar("b", start=1, end=2)], [], now=at(60), steps=steps
    )
    assert [row["needs"] for row in layout["rows"]] == [None, None]
    assert "wf-needs" not in layout["rows_html"]
    assert layout["rows_html"].count('<div class="wf-row"><div class="wf-label"><span class="mono">') == 2


def test_items_are_rows_under_their_step_in_index_order_and_the_step_counts_how_they_stand():
    bars = item_bars("read", 4, i1="failed", i2="running")
    bars.append(bars.pop(1))  # read[0] ended last: the journal's order is not the items' order
    layout = waterfall.waterfall_layout(a_run(), bars, [], now=at(60))

    (row,) = layout["rows"]
    assert row["step_id"] == "read"
    assert [item["step_id"] for item in row["items"]] == ["read[0]", "read[1]", "read[2]", "read[3]"]
    assert waterfall.item_counts(row) == {"done": 2, "failed": 1, "running": 1, "stopped": 0, "not started": 0}
    html = layout["rows_html"]
    assert '<div class="wf-row wf-group">' in html
    assert "<i>4 items: 2 done · 1 failed · 1 running · 2.0 s</i>" in html
    assert html.count('<div class="wf-row wf-item">') == 4
    assert html.index(">read[3]<") > html.index(">read<")  # the items come after their step's row
    assert "wf-items" not in html  # a few items are not folded


def test_a_narrow_for_each_bar_has_its_summary_beside_it_on_the_side_with_more_room():
    early = item_bars("read", 2, start=1)  # the step's bar: 1 s to 3 s of a 10 s axis, wide enough
    early[0]["ended_at"] = at(1.5)  # now 5 % wide, near the start: the summary goes to its right
    markers = [marker("run_succeeded", 10, step_id=None, attempt=None)]
    html = waterfall.waterfall_layout(a_run(), early, markers, now=at(60))["rows_html"]
    assert '<span class="wf-note" data-l="15.000">2 items: 2 done</span>' in html
    assert "<i>500 ms</i>" in html

    late = item_bars("read", 2, start=8)
    late[0]["ended_at"] = at(8.5)
    html = waterfall.waterfall_layout(a_run(), late, markers, now=at(60))["rows_html"]
    assert '<span class="wf-note" data-r="20.000">2 items: 2 done</span>' in html


def test_items_not_started_yet_are_counted_from_the_steps_item_count():
    bars = item_bars("read", 2)
    bars[0]["items"] = 5
    (row,) = waterfall.waterfall_layout(a_run(), bars, [], now=at(60))["rows"]
    assert waterfall.items_summary(row) == "5 items: 2 done · 3 not started"


def test_more_than_two_dozen_items_fold_all_but_the_first_few_and_those_that_did_not_complete():
    bars = item_bars("read", 30, i12="failed", i20="running", i27="interrupted")
    layout = waterfall.waterfall_layout(a_run(), bars, [], now=at(60))
    (row,) = layout["rows"]

    in_view, folded = waterfall.fold_items(row["items"])
    assert [item["index"] for item in in_view] == [0, 1, 2, 3, 4, 12, 20, 27]
    assert len(folded) == 22 and {item["status"] for item in folded} == {"completed"}
    html = layout["rows_html"]
    fold = html.index('<details class="wf-items"><summary>show all 30 items of read (22 more, all completed)')
    assert html.count('<div class="wf-row wf-item">') == 30
    assert html[:fold].count('<div class="wf-row wf-item">') == 8  # in view, before the fold
    assert html.endswith("</details>")


def test_two_dozen_items_are_all_in_view():
    items = [{"status": "completed"}] * waterfall.FOLD_ITEMS_OVER
    assert waterfall.fold_items(items) == (items, [])


def test_an_item_whose_step_has_no_row_keeps_a_row_of_its_own():
    layout = waterfall.waterfall_layout(a_run(), [bar("read[2]", start=1, end=2)], [], now=at(60))
    assert rows_of(layout) == ["read[2]"]


def test_a_skipped_step_is_a_row_of_its_own_where_it_was_skipped_with_its_when_and_the_value():
    bars = [bar("top", start=0, end=1), bar("left", start=1, end=2), bar("bottom", start=2, end=3)]
    markers = [
        marker("step_skipped", 1, step_id="right", attempt=None, when="steps.top.output.n == 2", value=False),
        marker("run_succeeded", 10, step_id=None, attempt=None),
    ]
    layout = waterfall.waterfall_layout(a_run(), bars, markers, now=at(60), steps=DIAMOND)

    assert rows_of(layout) == ["top", "right", "left", "bottom"]  # skipped before left started, same moment
    skipped = layout["rows"][1]
    assert (skipped["kind"], skipped["bars"], skipped["needs"]) == ("skipped", [], ["top"])
    assert skipped["skips"] == [
        {
            "left": "10.000",
            "text": "skipped: steps.top.output.n == 2 → false",
            "title": "right skipped at 12:00:01.000: when steps.top.output.n == 2 gave false",
        }
    ]
    html = layout["rows_html"]
    assert '<div class="wf-row wf-skipped">' in html
    assert '<span class="wf-skip" data-l="10.000"' in html
    assert '<span class="wf-skip-note" data-l="10.000">skipped: steps.top.output.n == 2 → false</span>' in html


def test_a_skip_late_in_the_run_reads_leftwards_and_a_long_value_is_cut():
    markers = [
        marker("step_skipped", 9, step_id="late", when="input.x", value="y" * 200),
        marker("run_succeeded", 10, step_id=None, attempt=None),
    ]
    layout = waterfall.waterfall_layout(a_run(), [bar("a", start=0, end=1)], markers, now=at(60))
    (skip,) = layout["rows"][1]["skips"]
    assert len(skip["text"]) < 90 and skip["text"].endswith("…")
    assert 'class="wf-skip-note" data-r="10.000"' in layout["rows_html"]


def test_a_run_whose_only_step_was_skipped_is_not_empty():
    markers = [marker("step_skipped", 0, step_id="only", when="input.go", value=None)]
    layout = waterfall.waterfall_layout(a_run(), [], markers, now=at(60))
    assert layout["empty"] is False and rows_of(layout) == ["only"]
    assert "→ null" in layout["rows_html"]


def test_the_graph_rows_escape_what_came_from_the_journal():
    markers = [marker("step_skipped", 1, step_id="<b>", when="input.x == '<i>'", value="<script>")]
    layout = waterfall.waterfall_layout(a_run(), [], markers, now=at(60))
    html = layout["rows_html"]
    assert "<script>" not in html and "<b>" not in html and "&lt;i&gt;" in html

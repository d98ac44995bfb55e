"""The workflow pages' SVG (runs.pages.charts): pure functions, read back with an XML parser."""

import xml.etree.ElementTree as ET

from runs.pages import charts

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(str(svg))
    assert root.tag == f"{SVG}svg" and root.get("role") == "img"
    return root


def title_of(root: ET.Element) -> str:
    title = root.find(f"{SVG}title")
    assert title is not None
    return title.text or ""


def steps(*specs) -> list[dict]:
    out = []
    for spec in specs:
        step_id, needs = spec if isinstance(spec, tuple) else (spec, None)
        step = {"id": step_id, "kind": "tool_call", "tool": "echo", "args": {}}
        if needs is not None:
            step["needs"] = needs
        out.append(step)
    return out


# --- the graph ------------------------------------------------------------------------------------


def test_a_diamond_puts_each_step_one_column_right_of_its_deepest_need():
    boxes, needs = charts.graph_layout(
        steps("plan", ("web", ["plan"]), ("papers", ["plan"]), ("read", ["web", "papers"]))
    )
    assert {s: b.column for s, b in boxes.items()} == {"plan": 0, "web": 1, "papers": 1, "read": 2}
    assert (boxes["web"].row, boxes["papers"].row) == (0, 1)  # the definition's order inside a column
    assert needs["read"] == ["web", "papers"]


def test_a_plain_list_is_drawn_as_a_chain_left_to_right():
    boxes, _ = charts.graph_layout(steps("a", "b", "c"))
    assert [boxes[s].column for s in "abc"] == [0, 1, 2]
    assert boxes["a"].x < boxes["b"].x < boxes["c"].x


def test_the_graph_has_a_box_per_step_and_an_arrow_per_need():
    root = parse(charts.graph_svg(steps("plan", ("web", ["plan"]), ("papers", ["plan"]), ("read", ["web", "papers"]))))
    assert [g.get("data-step") for g in root.iter(f"{SVG}g")] == ["plan", "web", "papers", "read"]
    edges = {(p.get("data-from"), p.get("data-to")) for p in root.iter(f"{SVG}path") if p.get("class") == "wfg-edge"}
    assert edges == {("plan", "web"), ("plan", "papers"), ("web", "read"), ("papers", "read")}
    assert title_of(root)


def test_a_step_with_no_needs_starts_a_column_of_its_own_with_no_arrow():
    root = parse(charts.graph_svg(steps("a", ("b", []))))
    boxes, _ = charts.graph_layout(steps("a", ("b", [])))
    assert boxes["b"].column == 0 and boxes["b"].row == 1
    assert [p for p in root.iter(f"{SVG}path") if p.get("class") == "wfg-edge"] == []


def test_text_in_the_graph_is_escaped():
    svg = charts.graph_svg([{"id": "a", "kind": "<script>alert(1)</script>"}])
    assert "<script>" not in str(svg)
    parse(svg)  # still well-formed


# --- charts ---------------------------------------------------------------------------------------


def test_stacked_bars_stack_each_hours_statuses_in_order_with_heights_in_proportion():
    root = parse(
        charts.stacked_bars_svg(
            ["10:00", "11:00"],
            [{"succeeded": 3, "failed": 1}, {"succeeded": 2}],
            series=["succeeded", "failed"],
            title="Runs by status",
        )
    )
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert [(b.get("data-label"), b.get("data-series"), b.get("data-value")) for b in bars] == [
        ("10:00", "succeeded", "3"),
        ("10:00", "failed", "1"),
        ("11:00", "succeeded", "2"),
    ]
    ok_10, failed_10, ok_11 = (float(b.get("height")) for b in bars)
    assert abs(ok_10 / ok_11 - 1.5) < 0.01 and abs(ok_10 / failed_10 - 3) < 0.01
    # failed sits on top of succeeded in the same bar
    assert abs(float(bars[1].get("y")) + failed_10 - float(bars[0].get("y"))) < 0.2
    assert title_of(root) == "Runs by status"


def test_an_hour_without_runs_draws_no_bar_and_an_empty_chart_still_draws():
    root = parse(charts.stacked_bars_svg(["a", "b"], [{}, {}], series=["succeeded"], title="none"))
    assert [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"] == []


def test_lines_leave_a_gap_where_an_hour_has_no_value():
    root = parse(
        charts.lines_svg(
            ["1", "2", "3", "4"],
            {"p50": [1.0, 2.0, None, 4.0]},
            title="durations",
            colours={"p50": "#000"},
            fmt=lambda v: f"{v:g} s",
        )
    )
    lines = list(root.iter(f"{SVG}polyline"))
    assert len(lines) == 1 and len(lines[0].get("points").split()) == 2  # 1-2 joined; 4 alone is a dot
    assert [c.get("data-value") for c in root.iter(f"{SVG}circle")] == ["1", "2", "4"]


def test_bars_are_as_tall_as_their_values_on_a_round_axis():
    root = parse(charts.bars_svg(["d1", "d2"], [0.5, 0.25], title="cost", fmt=lambda v: f"${v:g}"))
    tall, short = (float(r.get("height")) for r in root.iter(f"{SVG}rect") if r.get("class") == "bar")
    assert abs(tall / short - 2) < 0.01
    axis = [t.text for t in root.iter(f"{SVG}text")]
    assert "$0.5" in axis  # the axis tops at a round 0.5


def test_the_axis_top_is_a_round_number_at_or_above_the_largest_value():
    assert [charts._scale_top(v) for v in (0, 1, 7, 10, 11, 123, 0.003)] == [1.0, 1, 10, 10, 20, 200, 0.005]


def test_a_count_axis_tops_at_an_even_whole_number_so_its_middle_line_is_whole_too():
    assert [charts._scale_top(v, whole=True) for v in (0, 1, 3, 5, 7, 30, 41)] == [2, 2, 4, 10, 10, 40, 100]
    root = parse(charts.stacked_bars_svg(["h"], [{"succeeded": 3}], series=["succeeded"], title="runs"))
    assert [t.text for t in root.iter(f"{SVG}text")][:3] == ["0", "2", "4"]

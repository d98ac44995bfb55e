"""The workflow pages' pictures as server-side SVG: the graph of a definition's steps and three small charts."""

# Pure functions from plain values to SVG text: no queries, no JavaScript, no chart library. Every text that comes
# from a definition or a caller is escaped here, so the result is marked safe for templates. Each picture is an
# <svg role="img"> named by its <title>, so a screen reader says what it shows; the numbers themselves are in the
# page's tables too.

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe

from ..graph import needs_of, order

# The run statuses' colours (static/pal.css's --<status>), darker than the page's badges so bars read on white.
STATUS_COLOURS = {
    "queued": "#0e7490",
    "running": "#1d4ed8",
    "waiting": "#b45309",
    "succeeded": "#15803d",
    "failed": "#b91c1c",
    "cancelled": "#57534e",
}
INK, MUTED, LINE = "#1c1f24", "#4b5563", "#d5d9e0"  # MUTED keeps 7:1 on white (WCAG AA for small text)

# The graph's boxes: one column per depth (longest chain of needs before the step), one row per step in a column.
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 44, 56, 18, 12
KIND_COLOURS = {
    "llm_call": "#e3ebfd",
    "agent": "#e3ebfd",
    "tool_call": "#e0f2f5",
    "deliver": "#fdf0dc",
    "approval": "#fbe3e3",
    "signal": "#fbe3e3",
    "wait": "#ecebea",
    "child_run": "#dff3e5",
}

# The charts' frame.
CHART_W, CHART_H = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 76, 12, 14, 40


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _svg(width: int, height: int, title: str, body: list[str], *, css_class: str) -> SafeString:
    return mark_safe(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css_class}" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{_e(title)}</title>{"".join(body)}</svg>'
    )


# --- the graph ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    step_id: str
    kind: str
    column: int
    row: int
    x: int
    y: int


def graph_layout(steps: list[dict]) -> tuple[dict[str, Box], dict[str, list[str]]]:
    """Where each step's box goes, and each step's needs. A step's column is one more than its deepest need's,
    so every arrow points right; inside a column the steps keep the definition's order. A definition whose needs
    form a cycle (refused at posting, so only a hand-made one) is laid out in list order."""
    needs = needs_of(steps)
    try:
        ids = order(steps)
    except ValueError:
        ids = list(needs)
    kinds = {s["id"]: str(s.get("kind", "")) for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)}
    column: dict[str, int] = {}
    for step_id in ids:
        column[step_id] = 1 + max((column[n] for n in needs.get(step_id, []) if n in column), default=-1)
    rows: dict[int, int] = {}
    boxes = {}
    for step_id in ids:
        col = column[step_id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        x, y = PAD + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y)
        boxes[step_id] = Box(step_id, kinds.get(step_id, ""), col, row, x, y)
    return boxes, needs


def graph_svg(steps: list[dict], *, title: str = "The workflow's steps and what each needs") -> SafeString:
    """Boxes (id and kind) and an arrow from each need to the step that needs it."""
    boxes, needs = graph_layout(steps)
    width = PAD * 2 + (max((b.column for b in boxes.values()), default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    height = PAD * 2 + (max((b.row for b in boxes.values()), default=0) + 1) * (BOX_H + GAP_Y) - GAP_Y
    body = [
        '<defs><marker id="wfg-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{MUTED}"/></marker></defs>'
    ]
    for step_id, box in boxes.items():
        for need in needs.get(step_id, []):
            if need not in boxes:
                continue
            a = boxes[need]
            x1, y1, x2, y2 = a.x + BOX_W, a.y + BOX_H // 2, box.x, box.y + BOX_H // 2
            middle = (x1 + x2) // 2
            body.append(
                f'<path class="wfg-edge" data-from="{_e(need)}" data-to="{_e(step_id)}" '
                f'd="M{x1},{y1} C{middle},{y1} {middle},{y2} {x2},{y2}" fill="none" stroke="{MUTED}" '
                'stroke-width="1.5" marker-end="url(#wfg-arrow)"/>'
            )
    for step_id, box in boxes.items():
        fill = KIND_COLOURS.get(box.kind, "#f4f5f7")
        body.append(
            f'<g class="wfg-step" data-step="{_e(step_id)}"><rect x="{box.x}" y="{box.y}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="6" fill="{fill}" stroke="{MUTED}"/>'
            f'<text x="{box.x + 10}" y="{box.y + 18}" font-size="13" font-weight="600" fill="{INK}" '
            f'font-family="ui-monospace, monospace">{_e(_cut(step_id, 18))}</text>'
            f'<text x="{box.x + 10}" y="{box.y + 35}" font-size="11" fill="{MUTED}">{_e(box.kind)}</text></g>'
        )
    return _svg(max(width, 1), max(height, 1), title, body, css_class="wf-graph")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- charts ---------------------------------------------------------------------------------------


def _scale_top(value: float, *, whole: bool = False) -> float:
    """A round top for the y axis at or above value: 1, 2, 5 times a power of ten; for counts (whole) 2, 4, 10
    times one, so the middle grid line is a whole number too."""
    factors = (2, 4, 10) if whole else (1, 2, 5)
    if value <= 0:
        return float(factors[0])
    step = 10 ** len(str(int(value))) / 100 if value >= 1 else 1e-6
    if whole:
        step = max(step, 1.0)
    while True:
        for factor in factors:
            if step * factor >= value:
                return step * factor
        step *= 10


def _frame(top: float, labels: Sequence[str], fmt: Callable[[float], str], *, every: int) -> list[str]:
    """The grid lines at 0, half and the top with their values, and every `every`-th x label."""
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    parts = []
    for i in range(3):
        y = TOP + plot_h - plot_h * i / 2
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{CHART_W - RIGHT}" y2="{y:.1f}" stroke="{LINE}"/>')
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="{MUTED}">'
            f"{_e(fmt(top * i / 2))}</text>"
        )
    slot = plot_w / max(len(labels), 1)
    for i, label in enumerate(labels):
        if i % every == 0:
            x = LEFT + slot * (i + 0.5)
            parts.append(
                f'<text x="{x:.1f}" y="{CHART_H - BOTTOM + 16}" font-size="11" text-anchor="middle" '
                f'fill="{MUTED}">{_e(label)}</text>'
            )
    return parts


def _legend(series: Sequence[tuple[str, str]]) -> list[str]:
    parts, x = [], LEFT
    for name, colour in series:
        parts.append(
            f'<rect x="{x}" y="{CHART_H - 14}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14}" y="{CHART_H - 5}" font-size="11" fill="{INK}">{_e(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return parts


def stacked_bars_svg(
    labels: Sequence[str],
    counts: Sequence[dict[str, int]],
    *,
    series: Sequence[str],
    title: str,
    colours: dict[str, str] = STATUS_COLOURS,
    every: int = 1,
) -> SafeString:
    """One bar per label, stacked by series in the given order (runs by status per hour)."""
    top = _scale_top(max((sum(c.get(s, 0) for s in series) for c in counts), default=0), whole=True)
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    slot = plot_w / max(len(labels), 1)
    body = _frame(top, labels, lambda v: f"{v:g}", every=every)
    for i, (label, bucket) in enumerate(zip(labels, counts, strict=True)):
        base = float(TOP + plot_h)
        for name in series:
            n = bucket.get(name, 0)
            if not n:
                continue
            h = plot_h * n / top
            base -= h
            body.append(
                f'<rect class="bar" data-label="{_e(label)}" data-series="{_e(name)}" data-value="{n}" '
                f'x="{LEFT + slot * i + slot * 0.15:.1f}" y="{base:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                f'fill="{colours.get(name, INK)}"><title>{_e(label)}: {n} {_e(name)}</title></rect>'
            )
    body += _legend([(name, colours.get(name, INK)) for name in series])
    return _svg(CHART_W, CHART_H, title, body, css_class="chart")


def lines_svg(
    labels: Sequence[str],
    values: dict[str, Sequence[float | None]],
    *,
    title: str,
    colours: dict[str, str],
    fmt: Callable[[float], str],
    every: int = 1,
) -> SafeString:
    """One line per series over the labels (duration percentiles per hour); None leaves a gap, and a point with
    no neighbour shows as a dot."""
    top = _scale_top(max((v for vs in values.values() for v in vs if v is not None), default=0))
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    slot = plot_w / max(len(labels), 1)
    body = _frame(top, labels, fmt, every=every)
    for name, series in values.items():
        colour = colours.get(name, INK)
        runs: list[list[str]] = [[]]
        for i, v in enumerate(series):
            if v is None:
                runs.append([])
                continue
            x, y = LEFT + slot * (i + 0.5), TOP + plot_h - plot_h * v / top
            runs[-1].append(f"{x:.1f},{y:.1f}")
            body.append(
                f'<circle class="point" data-series="{_e(name)}" data-label="{_e(labels[i])}" data-value="{v:g}" '
                f'cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"><title>{_e(labels[i])}: {_e(name)} '
                f"{_e(fmt(v))}</title></circle>"
            )
        for points in runs:
            if len(points) > 1:
                body.append(
                    f'<polyline data-series="{_e(name)}" points="{" ".join(points)}" fill="none" '
                    f'stroke="{colour}" stroke-width="2"/>'
                )
    body += _legend([(name, colours.get(name, INK)) for name in values])
    return _svg(CHART_W, CHART_H, title, body, css_class="chart")


def bars_svg(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    fmt: Callable[[float], str],
    colour: str = "#1d4ed8",
    every: int = 1,
) -> SafeString:
    """One bar per label (cost per day)."""
    top = _scale_top(max(values, default=0))
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    slot = plot_w / max(len(labels), 1)
    body = _frame(top, labels, fmt, every=every)
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * v / top
        body.append(
            f'<rect class="bar" data-label="{_e(label)}" data-value="{v:g}" x="{LEFT + slot * i + slot * 0.15:.1f}" '
            f'y="{TOP + plot_h - h:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" fill="{colour}">'
            f"<title>{_e(label)}: {_e(fmt(v))}</title></rect>"
        )
    return _svg(CHART_W, CHART_H, title, body, css_class="chart")

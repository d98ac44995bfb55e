"""The run page's waterfall: where each step attempt's bar, each wait, tick and marker line sits on one time axis."""

# Pure functions of what runs.selectors.run_waterfall (the bars) and journal.selectors.waterfall_markers (the
# markers) read, and of the workflow's steps (for a graph's needs): no queries, no clock of their own (the caller
# passes now), positions in percent of the axis's width as the strings the HTML writes ("12.500"). runs.pages.run puts
# the result in the page's context.
#
# One row per step, so steps that run at the same time (a graph's branches) are on rows of their own; in a graph each
# row names the steps it needs. A for_each step's items ("read[3]") are rows under their step's row, folded past
# FOLD_ITEMS_OVER; a step whose `when` was false is a row with a "skipped" marker.

import json
import re
from datetime import UTC, datetime
from html import escape  # the rows' HTML: the stdlib's escape, not Django's lazy-aware wrapper (5,000 rows)
from typing import Any

from django.urls import reverse
from django.utils.safestring import mark_safe

from ..graph import needs_of
from ..models import FINAL_STATUSES
from .formatting import clock, delta_text

TICKS = (0, 25, 50, 75, 100)  # where the scale under the waterfall is labelled, in percent of its width
MIN_SPAN = 0.001  # seconds: an axis of one instant still has a width to divide by
FOLD_ITEMS_OVER = 24  # a for_each step with more item rows than this shows a few and folds the rest
ITEMS_SHOWN = 5  # folded: the first items left in view (failed and unfinished ones are always in view)
ITEM_ID = re.compile(r"^(?P<step>.+)\[(?P<index>\d+)\]$")  # "read[3]": item 3 of the for_each step read
SKIP_VALUE_CHARS = 60  # a skipped step's `when` value is shown up to this long (the journal has all of it)
NOTE_ROOM = 30.0  # percent of the track: a bar this wide holds its items' summary; a narrower one has it beside


def percent(moment: datetime, start: datetime, span: float) -> float:
    """Where moment falls on an axis from start lasting span seconds, in percent, clamped to 0..100."""
    return min(max((moment - start).total_seconds() / span * 100.0, 0.0), 100.0)


def run_end(run, *, now: datetime) -> datetime:
    """Where a run's open bars and waits stop: its end when it has ended, else now."""
    return run.finished_at if run.status in FINAL_STATUSES and run.finished_at else now


def time_axis(run, bars: list[dict], markers: list[dict], *, now: datetime) -> tuple[datetime, datetime]:
    """(start, end) covering the run's creation, every bar and marker and, while the run goes on, now."""
    moments = [run.created_at] + [b["started_at"] for b in bars] + [m["at"] for m in markers]
    moments += [b["ended_at"] for b in bars if b["ended_at"]]
    end = max(moments + ([] if run.status in FINAL_STATUSES else [now]))
    return min(moments), end


def bar_segment(run, bar: dict, *, start: datetime, span: float, until: datetime) -> dict:
    """One step attempt's bar. A running or waiting attempt with no end yet reaches until (the run's end or now);
    an attempt that ended with no outcome is a zero-width bar at its start."""
    ended = bar["ended_at"] or (until if bar["status"] in ("running", "waiting") else None)
    left = percent(bar["started_at"], start, span)
    right = percent(ended, start, span) if ended else left
    took = delta_text(ended - bar["started_at"]) if ended else "no outcome"
    key = f"{run.id}:{bar['step_id']}:{bar['attempt']}"
    if bar.get("reused_from"):
        source = bar["reused_from"]
        title = (
            f"{bar['step_id']} · reused from run {str(source.get('run_id'))[:8]} (its journal row {source.get('seq')})"
            " by the fork (no call)"
        )
    elif bar["cached"]:
        title = (
            f"{bar['step_id']} · attempt {bar['attempt']} reused from the journal by the re-drive at "
            f"{clock(bar['started_at'])} (no call) · key {key}"
        )
    else:
        title = (
            f"{bar['step_id']} · attempt {bar['attempt']} · {bar['status']} · {clock(bar['started_at'])}"
            f" → {clock(bar['ended_at']) if bar['ended_at'] else '…'} · {took} · key {key}"
        )
    return {
        "left": f"{left:.3f}",
        "width": f"{max(right - left, 0.0):.3f}",
        "status": bar["status"],
        "cached": bar["cached"],
        "attempt": bar["attempt"],
        "title": title,
        "label": "" if bar["cached"] else took,
    }


def step_lanes(run, bars: list[dict], *, start: datetime, span: float, until: datetime) -> dict[str, dict]:
    """One lane per step, in the order steps first ran, holding its attempts' bars and the child runs they
    started (each once); waits and ticks are filled in from the markers."""
    lanes: dict[str, dict] = {}
    for bar in bars:
        lane = lanes.get(bar["step_id"])
        if lane is None:
            lane = lanes[bar["step_id"]] = new_lane(bar["step_id"], bar["kind"] or "", first_at=bar["started_at"])
        lane["bars"].append(bar_segment(run, bar, start=start, span=span, until=until))
        lane["status"] = bar["status"]
        if bar.get("items") is not None:
            lane["total"] = bar["items"]
        if bar["child_run_id"] and bar["child_run_id"] not in lane["children"]:
            lane["children"].append(bar["child_run_id"])
    return lanes


def new_lane(step_id: str, kind: str, *, first_at: datetime) -> dict:
    """An empty row. status: its last bar's; total: a for_each step's item count; items: its items' rows."""
    return {
        "step_id": step_id,
        "kind": kind,
        "first_at": first_at,
        "status": "",
        "bars": [],
        "waits": [],
        "ticks": [],
        "children": [],
        "skips": [],
        "needs": None,
        "total": None,
        "items": [],
    }


def skip_mark(marker: dict, *, start: datetime, span: float) -> dict:
    """A skipped step's marker: where its `when` was found false, the expression and the value that decided."""
    value = json.dumps(marker.get("value"), default=str)
    if len(value) > SKIP_VALUE_CHARS:
        value = value[: SKIP_VALUE_CHARS - 1] + "…"
    when = marker.get("when") or ""
    return {
        "left": f"{percent(marker['at'], start, span):.3f}",
        "text": f"skipped: {when} → {value}",
        "title": f"{marker['step_id']} skipped at {clock(marker['at'])}: when {when} gave {value}",
    }


def place_skips(markers: list[dict], lanes: dict[str, dict], *, start: datetime, span: float) -> dict[str, dict]:
    """The lanes with every skipped step in them: a step that has a row gets the marker in it; one that never ran
    gets a row of its own, placed among the others by when it was skipped (before a step that started at the
    same moment: the walk journals the skip first). Returns a new dict in that order."""
    skipped: dict[str, dict] = {}
    for marker in markers:
        if marker["kind"] != "step_skipped" or not marker["step_id"]:
            continue
        step_id = marker["step_id"]
        lane = lanes.get(step_id) or skipped.get(step_id)
        if lane is None:
            lane = skipped[step_id] = new_lane(step_id, "skipped", first_at=marker["at"])
        lane["skips"].append(skip_mark(marker, start=start, span=span))
    if not skipped:
        return lanes
    waiting = sorted(skipped.values(), key=lambda lane: lane["first_at"])  # stable: journal order on a tie
    ordered: dict[str, dict] = {}
    for step_id, lane in lanes.items():
        while waiting and waiting[0]["first_at"] <= lane["first_at"]:
            first = waiting.pop(0)
            ordered[first["step_id"]] = first
        ordered[step_id] = lane
    for lane in waiting:
        ordered[lane["step_id"]] = lane
    return ordered


def item_of(step_id: str) -> tuple[str, int] | None:
    """("read", 3) for the item step id "read[3]"; None for a step's own id."""
    match = ITEM_ID.match(step_id)
    return (match["step"], int(match["index"])) if match else None


def group_items(lanes: dict[str, dict]) -> list[dict]:
    """The rows in order with each item's row moved under its for_each step's row (lane["items"], by index). An
    item whose step has no row (a journal cut short) keeps a row of its own."""
    rows = []
    for step_id, lane in lanes.items():
        item = item_of(step_id)
        parent = lanes.get(item[0]) if item else None
        if item is None or parent is None:
            rows.append(lane)
        else:
            lane["index"] = item[1]
            parent["items"].append(lane)
    for row in rows:
        if row["items"]:
            row["items"].sort(key=lambda lane: lane["index"])
    return rows


def item_counts(row: dict) -> dict[str, int]:
    """How a for_each step's items stand, by their last attempt: done, failed, running (or waiting), stopped
    (interrupted or cancelled), and not started (its item count less the items that have a row)."""
    counts = {"done": 0, "failed": 0, "running": 0, "stopped": 0}
    for item in row["items"]:
        status = item["status"]
        key = {"completed": "done", "failed": "failed", "running": "running", "waiting": "running"}.get(status)
        counts[key or "stopped"] += 1
    counts["not started"] = max((row["total"] or 0) - len(row["items"]), 0)
    return counts


def items_summary(row: dict) -> str:
    """ "30 items: 28 done · 1 failed · 1 running", leaving out the counts that are zero."""
    counts = item_counts(row)
    total = row["total"] if row["total"] is not None else len(row["items"])
    parts = [f"{n} {what}" for what, n in counts.items() if n]
    return f"{total} item{'' if total == 1 else 's'}" + (": " + " · ".join(parts) if parts else "")


def fold_items(items: list[dict], *, over: int = FOLD_ITEMS_OVER, shown: int = ITEMS_SHOWN) -> tuple[list, list]:
    """(the item rows in view, the rows behind the fold). Up to `over` items are all in view; past that, the
    first `shown` and every item that did not complete stay in view (what an operator looks for), in index
    order, and the rest are folded."""
    if len(items) <= over:
        return items, []
    in_view: list[dict] = []
    folded: list[dict] = []
    for position, item in enumerate(items):
        (in_view if position < shown or item["status"] != "completed" else folded).append(item)
    return in_view, folded


def mark_needs(rows: list[dict], steps: list[dict] | None) -> None:
    """In a graph (a step says `needs`), each step's row gets the steps it needs (needs_of: absent is the step
    listed just before). A plain list's rows get none: each needs the one above it, which the order shows."""
    if not steps or not any(isinstance(step, dict) and "needs" in step for step in steps):
        return
    needs = needs_of(steps)
    for row in rows:
        row["needs"] = needs.get(row["step_id"])


def wait_segment(wait: dict, until: datetime, start: datetime, span: float, resumed: dict | None) -> dict:
    """A step's wait from wait["at"] to until: resumed (by whom, why) or still waiting."""
    left, right = percent(wait["at"], start, span), percent(until, start, span)
    how = (
        f"resumed at {clock(until)}" + (f" by {resumed['by']}: {resumed['why']}" if resumed and resumed["by"] else "")
        if resumed
        else "still waiting"
    )
    return {
        "left": f"{left:.3f}",
        "width": f"{max(right - left, 0.0):.3f}",
        "title": f"waiting on {wait['on']} from {clock(wait['at'])}; {how}",
    }


def marker_line(marker: dict, where: str) -> dict | None:
    """The full-height line of a re-drive, a retry, a move or the run's end; None for the other kinds."""
    kind, at = marker["kind"], marker["at"]
    if kind in ("run_redriven", "run_retried"):
        verb = (
            "re-driven" if kind == "run_redriven" else f"retried (step {marker['step_id']} attempt {marker['attempt']})"
        )
        force = " (forced)" if marker["force"] else ""
        return {
            "left": where,
            "kind": "redrive" if kind == "run_redriven" else "retry",
            "title": f"{verb}{force} at {clock(at)} by {marker['by'] or '?'}: {marker['why'] or ''}",
        }
    if kind == "definition_moved" and marker["step_id"] is None:  # the move's own row, not a step's
        return {
            "left": where,
            "kind": "move",
            "title": f"moved to another version at {clock(at)} by {marker['by'] or '?'}: {marker['why'] or ''}",
        }
    if kind in ("run_succeeded", "run_failed", "run_cancelled"):
        return {
            "left": where,
            "kind": "end",
            "title": f"{kind.removeprefix('run_')} at {clock(at)}"
            + (f" by {marker['by']}: {marker['why']}" if marker["by"] else ""),
        }
    return None


def place_markers(
    markers: list[dict], lanes: dict[str, dict], *, start: datetime, span: float, until: datetime
) -> list[dict]:
    """Put the markers on the axis: the lines it returns; each lane's waits (a run_waiting to its run_resumed, or
    to until when it has not resumed) and ticks (back-offs, retries of an unknown outcome) go into the lane."""
    lines = []
    open_waits: dict[tuple, dict] = {}
    for marker in markers:
        kind, at, step_id = marker["kind"], marker["at"], marker["step_id"]
        where = f"{percent(at, start, span):.3f}"
        line = marker_line(marker, where)
        if line is not None:
            lines.append(line)
        elif kind == "run_waiting" and step_id in lanes:
            open_waits[(step_id, marker["attempt"])] = {"at": at, "on": marker["waiting_on"] or "something"}
        elif kind == "run_resumed":
            wait = open_waits.pop((step_id, marker["attempt"]), None)
            if wait and step_id in lanes:
                lanes[step_id]["waits"].append(wait_segment(wait, at, start, span, marker))
        elif kind in ("run_backoff", "step_retrying") and step_id in lanes:
            what = (
                "back-off before the next attempt"
                if kind == "run_backoff"
                else f"unknown outcome, same attempt and key retried: {marker['message'] or ''}"
            )
            lanes[step_id]["ticks"].append({"left": where, "kind": kind, "title": f"{clock(at)} {what}"})
    for (step_id, _attempt), wait in open_waits.items():
        lanes[step_id]["waits"].append(wait_segment(wait, until, start, span, None))
    return lines


def scale_ticks(start: datetime, end: datetime) -> list[dict]:
    """The scale's labels: the start's clock time at 0 %, then the time since start ("+1.5 s") at each tick."""
    return [
        {"left": f"{p}", "label": "+" + delta_text((end - start) * (p / 100)) if p else clock(start)} for p in TICKS
    ]


def waterfall_layout(
    run, bars: list[dict], markers: list[dict], *, now: datetime, axis=None, steps: list[dict] | None = None
) -> dict:
    """Place the bars and markers on one time axis (percent of its width), one row per step in the order steps
    first ran, items under their step. axis: (start, end) of a parent's waterfall, so a nested child lines up with
    its parent. steps: the workflow definition's steps, for a graph's needs."""
    until = run_end(run, now=now)
    start, end = axis if axis else time_axis(run, bars, markers, now=now)
    span = max((end - start).total_seconds(), MIN_SPAN)
    lanes = step_lanes(run, bars, start=start, span=span, until=until)
    lines = place_markers(markers, lanes, start=start, span=span, until=until)
    rows = group_items(place_skips(markers, lanes, start=start, span=span))
    mark_needs(rows, steps)
    layout: dict[str, Any] = {
        "rows": rows,
        "lines": lines,
        "ticks": scale_ticks(start, end),
        "start": start,
        "end": end,
        "axis": format_axis(start, end),
        "empty": not rows,
    }
    layout["rows_html"] = waterfall_rows_html(layout, axis=layout["axis"])
    return layout


def format_axis(start: datetime, end: datetime) -> str:
    """The axis as a nested child's waterfall is asked for it (?axis=): two Unix times."""
    return f"{start.timestamp():.6f},{end.timestamp():.6f}"


def parse_axis(raw: str | None) -> tuple[datetime, datetime] | None:
    """format_axis read back; None for no axis or one that does not read (the child gets an axis of its own)."""
    if not raw:
        return None
    try:
        first, second = (float(x) for x in raw.split(","))
        return datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(second, UTC)
    except (ValueError, OverflowError, OSError):
        return None


def waterfall_rows_html(layout: dict, *, axis: str) -> str:
    """The waterfall's rows as HTML, built here rather than in a template loop: a run of 5,000 steps has 5,000
    rows, and the template engine takes ten times as long over them (docs/PERFORMANCE-pages.md). Everything
    that comes from the journal is escaped."""
    out: list[str] = []
    for row in layout["rows"]:
        row_html(out, row, axis=axis)
    return mark_safe("".join(out))


def row_html(out: list[str], row: dict, *, axis: str, item: bool = False) -> None:
    """One step's row (then its items' rows, then its child runs), appended to out."""
    append = out.append
    classes = "wf-row" + (" wf-item" if item else "") + (" wf-group" if row["items"] else "")
    classes += " wf-skipped" if row["skips"] and not row["bars"] else ""
    needs = row["needs"]
    label = f'<span class="mono">{escape(row["step_id"])}</span> <span class="kind">{escape(row["kind"])}</span>'
    if needs:
        label += f' <span class="wf-needs">← {escape(", ".join(needs))}</span>'
    title = f' title="{escape(row["step_id"])} needs {escape(", ".join(needs))}"' if needs else ""
    append(f'<div class="{classes}"><div class="wf-label"{title}>{label}</div><div class="wf-track">')
    for wait in row["waits"]:
        append(
            f'<span class="wf-wait" data-l="{wait["left"]}" data-w="{wait["width"]}" '
            f'title="{escape(wait["title"])}"></span>'
        )
    summary = items_summary(row) if row["items"] or row["total"] is not None else ""
    last = next((bar for bar in reversed(row["bars"]) if not bar["cached"]), None)
    note = note_side(last) if summary and last else None
    for bar in row["bars"]:
        text = ("#{} ".format(bar["attempt"]) if bar["attempt"] and bar["attempt"] > 1 else "") + bar["label"]
        if summary and bar is last and note is None:
            text = f"{summary} · {text}" if text else summary
        append(
            f'<span class="wf-bar bar-{bar["status"]}{" bar-cached" if bar["cached"] else ""}" '
            f'data-l="{bar["left"]}" data-w="{bar["width"]}" '
            f'title="{escape(bar["title"] + (" · " + summary if summary else ""))}"><i>{escape(text)}</i></span>'
        )
    if note is not None:
        append(f'<span class="wf-note" {note}>{escape(summary)}</span>')
    for tick in row["ticks"]:
        append(
            f'<span class="wf-tick tick-{tick["kind"]}" data-l="{tick["left"]}" title="{escape(tick["title"])}"></span>'
        )
    for skip in row["skips"]:
        # The note reads away from the nearer edge, so a skip late in the run stays on the track.
        side = f'data-l="{skip["left"]}"' if float(skip["left"]) <= 50 else f'data-r="{100 - float(skip["left"]):.3f}"'
        append(
            f'<span class="wf-skip" data-l="{skip["left"]}" title="{escape(skip["title"])}"></span>'
            f'<span class="wf-skip-note" {side}>{escape(skip["text"])}</span>'
        )
    append("</div></div>")
    items_html(out, row, axis=axis)
    for child in row["children"]:
        page = reverse("runs:detail", args=[child])
        append(
            f'<details class="wf-child" hx-get="{reverse("runs:waterfall", args=[child])}?axis={axis}" '
            f'hx-trigger="toggle once" hx-target="find .wf-nested" hx-swap="innerHTML"><summary>child run '
            f'<span class="mono">{escape(str(child)[:8])}</span> of step {escape(row["step_id"])}</summary>'
            f'<div class="wf-nested"><a href="{page}">open child run {escape(str(child)[:8])}</a></div>'
            f"</details>"
        )


def note_side(bar: dict) -> str | None:
    """Where a for_each step's summary goes: None inside its bar when the bar is wide enough, else the place (a
    data attribute, see pal.css) that sets it beside the bar, on the side with more room."""
    left, width = float(bar["left"]), float(bar["width"])
    if width >= NOTE_ROOM:
        return None
    right = left + width
    return f'data-l="{right:.3f}"' if 100 - right >= left else f'data-r="{100 - left:.3f}"'


def items_html(out: list[str], row: dict, *, axis: str) -> None:
    """A for_each step's item rows under its row; past FOLD_ITEMS_OVER the rest sit in a <details> (no script
    needed to open it) behind "show all N"."""
    if not row["items"]:
        return
    in_view, folded = fold_items(row["items"])
    for item in in_view:
        row_html(out, item, axis=axis, item=True)
    if folded:
        out.append(
            f'<details class="wf-items"><summary>show all {len(row["items"])} items of '
            f"{escape(row['step_id'])} ({len(folded)} more, all completed)</summary>"
        )
        for item in folded:
            row_html(out, item, axis=axis, item=True)
        out.append("</details>")

"""The run page's waterfall: where each step attempt's bar, each wait, tick and marker line sits on one time axis.

Pure functions of what runs.selectors.run_waterfall (the bars) and journal.selectors.waterfall_markers (the
markers) read: no queries, no clock of their own (the caller passes now), positions in percent of the axis's width
as the strings the HTML writes ("12.500"). runs.views puts the result in the page's context.
"""

from datetime import UTC, datetime
from html import escape  # the rows' HTML: the stdlib's escape, not Django's lazy-aware wrapper (5,000 rows)
from typing import Any

from django.urls import reverse
from django.utils.safestring import mark_safe

from .formatting import clock, delta_text
from .models import FINAL_STATUSES

TICKS = (0, 25, 50, 75, 100)  # where the scale under the waterfall is labelled, in percent of its width
MIN_SPAN = 0.001  # seconds: an axis of one instant still has a width to divide by


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
    if bar["cached"]:
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
            lane = lanes[bar["step_id"]] = {
                "step_id": bar["step_id"],
                "kind": bar["kind"] or "",
                "bars": [],
                "waits": [],
                "ticks": [],
                "children": [],
            }
        lane["bars"].append(bar_segment(run, bar, start=start, span=span, until=until))
        if bar["child_run_id"] and bar["child_run_id"] not in lane["children"]:
            lane["children"].append(bar["child_run_id"])
    return lanes


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
    """The full-height line of a re-drive, a retry or the run's end; None for the other kinds."""
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


def waterfall_layout(run, bars: list[dict], markers: list[dict], *, now: datetime, axis=None) -> dict:
    """Place the bars and markers on one time axis (percent of its width), one row per step in the order steps
    first ran. axis: (start, end) of a parent's waterfall, so a nested child lines up with its parent."""
    until = run_end(run, now=now)
    start, end = axis if axis else time_axis(run, bars, markers, now=now)
    span = max((end - start).total_seconds(), MIN_SPAN)
    lanes = step_lanes(run, bars, start=start, span=span, until=until)
    lines = place_markers(markers, lanes, start=start, span=span, until=until)
    layout: dict[str, Any] = {
        "rows": list(lanes.values()),
        "lines": lines,
        "ticks": scale_ticks(start, end),
        "start": start,
        "end": end,
        "axis": format_axis(start, end),
        "empty": not bars,
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
    append = out.append
    for row in layout["rows"]:
        append(
            f'<div class="wf-row"><div class="wf-label"><span class="mono">{escape(row["step_id"])}</span> '
            f'<span class="kind">{escape(row["kind"])}</span></div><div class="wf-track">'
        )
        for wait in row["waits"]:
            append(
                f'<span class="wf-wait" style="left:{wait["left"]}%;width:{wait["width"]}%" '
                f'title="{escape(wait["title"])}"></span>'
            )
        for bar in row["bars"]:
            label = ("#{} ".format(bar["attempt"]) if bar["attempt"] and bar["attempt"] > 1 else "") + bar["label"]
            append(
                f'<span class="wf-bar bar-{bar["status"]}{" bar-cached" if bar["cached"] else ""}" '
                f'style="left:{bar["left"]}%;width:{bar["width"]}%" title="{escape(bar["title"])}">'
                f"<i>{escape(label)}</i></span>"
            )
        for tick in row["ticks"]:
            append(
                f'<span class="wf-tick tick-{tick["kind"]}" style="left:{tick["left"]}%" '
                f'title="{escape(tick["title"])}"></span>'
            )
        append("</div></div>")
        for child in row["children"]:
            page = reverse("runs:detail", args=[child])
            append(
                f'<details class="wf-child" hx-get="{reverse("runs:waterfall", args=[child])}?axis={axis}" '
                f'hx-trigger="toggle once" hx-target="find .wf-nested" hx-swap="innerHTML"><summary>child run '
                f'<span class="mono">{escape(str(child)[:8])}</span> of step {escape(row["step_id"])}</summary>'
                f'<div class="wf-nested"><a href="{page}">open child run {escape(str(child)[:8])}</a></div>'
                f"</details>"
            )
    return mark_safe("".join(out))

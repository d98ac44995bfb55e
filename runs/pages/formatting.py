"""How the operator's pages write durations, clock times, money, leases and JSON: plain functions, no queries.

The template filters (runs.templatetags.runs_pages) and the pages (runs.pages.run, runs.pages.waterfall) call these,
so one duration reads the same on every page ("1.5 s" in the run list, the run's header, its waterfall and /ops/).
"""

import json
from datetime import UTC, datetime, timedelta

from django.core.serializers.json import DjangoJSONEncoder

from journal.text import utf8_safe_json


def duration_text(seconds: float) -> str:
    """A duration for people: "840 ms", "1.5 s", "2 min 5 s", "3 h 20 min", "2 d 4 h".

    Rounded once at the unit shown, so 59.96 s reads "1 min 0 s", never "60.0 s". A negative duration (two
    hosts' clocks a little apart) reads as none.
    """
    seconds = max(float(seconds), 0.0)
    millis = round(seconds * 1000)
    if millis < 1000:
        return f"{millis} ms"
    tenths = round(seconds * 10)
    if tenths < 600:
        return f"{tenths / 10:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = whole // 60
    if minutes < 24 * 60:
        return f"{minutes // 60} h {minutes % 60} min"
    hours = minutes // 60
    return f"{hours // 24} d {hours % 24} h"


def delta_text(delta: timedelta) -> str:
    """duration_text of a timedelta (end - start)."""
    return duration_text(delta.total_seconds())


def run_took(run, *, now: datetime) -> str:
    """How long a run went (or has been going, until now), from its start; "" before it started."""
    if not run.started_at:
        return ""
    return delta_text((run.finished_at or now) - run.started_at)


def clock(moment: datetime | None) -> str:
    """HH:MM:SS.mmm in UTC (what the journal's time column shows too); "—" for no time."""
    if not moment:
        return "—"
    if moment.utcoffset():
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds")[11:23]


def usd(value) -> str:
    """An amount in dollars: "$0", "$0.00042" (below a cent, every significant digit), "$1,234.5600"."""
    value = float(value or 0)
    if value == 0:
        return "$0"
    return f"${value:.6f}".rstrip("0") if value < 0.01 else f"${value:,.4f}"


def lease_text(lease: dict | None, now: datetime) -> str:
    """The run header's lease line: holder, epoch and when it expires (or expired)."""
    if lease is None:
        return "no lease"
    left = (lease["expires_at"] - now).total_seconds()
    when = f"expires in {left:.0f}s" if left >= 0 else f"expired {-left:.0f}s ago"
    return f"{lease['owner']} · epoch {lease['epoch']} · {when}"


def pretty_json(value) -> str:
    # utf8_safe_json: a model's unpaired surrogate is shown as the "\ud800" it came as (a page is UTF-8).
    return utf8_safe_json(json.dumps(value, cls=DjangoJSONEncoder, indent=2, ensure_ascii=False, sort_keys=False))


def compact_json(value, limit: int = 140) -> str:
    """One line of JSON, cut with "…" after limit characters (the journal's summary column)."""
    text = utf8_safe_json(json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":")))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def attribute_text(value) -> str:
    """A run attribute's value as its filter reads it: a string as it is, any other value as compact JSON (an
    unpaired surrogate shown as the "\\ud800" it came as: a page is UTF-8)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode()

"""Small filters for the operator's pages: short ids, ages, durations, money. No queries."""

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def short(value) -> str:
    """The first 8 characters of a run id: what the pages show (the full id is in the title and the link)."""
    return str(value)[:8]


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds // 86400:.0f} d {seconds % 86400 // 3600:.0f} h"


@register.filter
def ago(moment) -> str:
    if not moment:
        return ""
    seconds = (timezone.now() - moment).total_seconds()
    return "just now" if seconds < 1 else f"{_span(seconds)} ago"


@register.filter
def took(run) -> str:
    """How long a run has been going (or went), from its start."""
    if not run.started_at:
        return ""
    return _span(((run.finished_at or timezone.now()) - run.started_at).total_seconds())


@register.filter
def usd(value) -> str:
    value = float(value or 0)
    if value == 0:
        return "$0"
    return f"${value:.6f}".rstrip("0") if value < 0.01 else f"${value:,.4f}"


@register.filter
def until(moment) -> str:
    """'in 12s' or '3s ago' for a lease's expiry (pal.js keeps it counting)."""
    if not moment:
        return ""
    seconds = (moment - timezone.now()).total_seconds()
    return f"in {seconds:.0f}s" if seconds >= 0 else f"{-seconds:.0f}s ago"


@register.filter
def sweep_took(sweep) -> str:
    if not sweep.finished_at:
        return ""
    return _span((sweep.finished_at - sweep.started_at).total_seconds())


@register.filter
def seconds(value) -> str:
    """A duration given in seconds (a number or the receipts' decimal string)."""
    try:
        return _span(float(value))
    except (TypeError, ValueError):
        return ""

"""Small filters for the operator's pages: short ids, ages, durations, money. No queries.

Each filter calls a plain function of runs.pages.formatting, which the views and the waterfall call too: one format.
"""

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs import answers, decisions
from runs.pages import formatting
from runs.selectors.moves import WHY

register = template.Library()


@register.filter
def short(value) -> str:
    """The first 8 characters of a run id: what the pages show (the full id is in the title and the link)."""
    return str(value)[:8]


@register.filter
def ago(moment) -> str:
    if not moment:
        return ""
    seconds = (timezone.now() - moment).total_seconds()
    return "just now" if seconds < 1 else f"{formatting.duration_text(seconds)} ago"


@register.filter
def took(run) -> str:
    """How long a run has been going (or went), from its start."""
    return formatting.run_took(run, now=timezone.now())


@register.filter
def usd(value) -> str:
    return formatting.usd(value)


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
    return formatting.delta_text(sweep.finished_at - sweep.started_at)


@register.filter
def seconds(value) -> str:
    """A duration given in seconds (a number or the receipts' decimal string)."""
    try:
        return formatting.duration_text(float(value))
    except (TypeError, ValueError):
        return ""


@register.filter(name="pretty_json")
def pretty_json_filter(value) -> str:
    """JSON, indented (a form's textarea of arguments)."""
    return formatting.pretty_json(value)


@register.filter
def attribute_text(value) -> str:
    return formatting.attribute_text(value)


@register.filter
def answer_fields(wait) -> list[dict]:
    """The fields of an approval's form (its wait's `form`), as the decision form draws them; none without a form."""
    form = wait.get("form") if isinstance(wait, dict) else None
    return answers.fields_of(form) if isinstance(form, dict) else []


@register.filter
def assignee(wait) -> str:
    """Whom an approval is assigned to, in words ("group billing")."""
    return decisions.assignee_text(wait) if isinstance(wait, dict) else ""


@register.filter
def decidable_by(wait, user) -> bool:
    """Whether the user may decide this approval (its assignee, a superuser, anyone when it is not assigned)."""
    return decisions.may_decide(wait, user) if isinstance(wait, dict) else False


@register.filter
def moment(text):
    """An ISO time of the journal or a wait (a deadline) as a datetime, for the date filter; None when it is none."""
    return parse_datetime(text) if isinstance(text, str) else None


@register.filter
def move_why(code: str) -> str:
    """Why a step runs again after a move (runs.selectors.moves.WHY), in words."""
    return WHY.get(code, code)

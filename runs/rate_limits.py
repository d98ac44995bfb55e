"""Rate limits across the fleet (PAL_RATE_LIMITS, docs/reference/settings.md): at most requests_per_minute calls of a
limit start in any 60-second window, and none starts while the calls that started in the last 60 s reported
tokens_per_minute tokens or more. Every try counts (a transport retry too)."""

# The count is a table every worker shares (RateSlot: one row per call that started), read and written under a lock on
# the limit's row (runs.concurrency.key_lock, keyed "rate:{limit}"), so two workers never both take the last slot. A
# call that would go over does not start: its step waits durably as on a timer, until the window's oldest call leaves
# it, holding no worker (runs.walk.capabilities.StepCapabilities.rate_limit raises the Wait). Rows that left the window
# are pruned by the sweep (rate_slots_prune), not by the calls. Windows are stamped and read by the database's clock
# (pal.clock): workers whose clocks disagree share one window.

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from pal.clock import db_clock, db_now

from .concurrency import key_lock
from .models import RateSlot

WINDOW = timedelta(seconds=60)
# A slot is taken just before its call is sent, and the peer sees the call a moment later: a cold first call (a new
# connection on a worker that just took it) can reach it later than a warm one a minute on. So a slot keeps its
# place for a window and this margin: the peer's own 60-second windows never hold more than the limit.
SEND_MARGIN = timedelta(seconds=2)


def limits_for(channel: str, name: str) -> list[tuple[str, dict]]:
    """The limits that apply to one call: `{channel}:{name}` and `{channel}:*`."""
    limits = settings.PAL_RATE_LIMITS or {}
    names = [f"{channel}:{name}", f"{channel}:*"] if name != "*" else [f"{channel}:*"]
    return [(limit, limits[limit]) for limit in dict.fromkeys(names) if limit in limits]


def rate_take(*, channel: str, name: str, run_id, step_key: str, now: datetime | None = None):
    """Take a slot in every limit of the call: (slot ids, None) when it may start now, or (None, {limit, until, ...})
    when a limit is full (nothing taken)."""
    limits = limits_for(channel, name)
    if not limits:
        return [], None
    with transaction.atomic():
        for limit, _ in sorted(limits):  # in one order: two calls of the same two limits never deadlock
            key_lock(f"rate:{limit}")
        now = now or db_now()  # once the locks are ours: a wait for them does not age the window's edge
        since = now - WINDOW - SEND_MARGIN
        for limit, spec in limits:
            window = RateSlot.objects.filter(key=limit, started_at__gt=since)
            full = None
            rpm, tpm = spec.get("requests_per_minute"), spec.get("tokens_per_minute")
            if rpm is not None and window.count() >= rpm:
                full = ("requests_per_minute", rpm, window.order_by("started_at").values_list("started_at", flat=True))
            elif tpm is not None and (window.aggregate(t=Sum("tokens"))["t"] or 0) >= tpm:
                used = window.filter(tokens__gt=0).order_by("started_at").values_list("started_at", flat=True)
                full = ("tokens_per_minute", tpm, used)
            if full is not None:
                field, value, oldest = full
                first = oldest.first() or now
                until = first + WINDOW + SEND_MARGIN + timedelta(milliseconds=50)
                return None, {"limit": limit, field: value, "until": until}
        slots = [RateSlot(key=limit, started_at=now, run_id=run_id, step_key=step_key) for limit, _ in limits]
        RateSlot.objects.bulk_create(slots)  # Postgres and SQLite (3.35+) both return the new rows' ids
        return [slot.pk for slot in slots], None


def rate_report(slot_ids: list[int], tokens: int) -> None:
    """The tokens a call reported, on the slots it took (tokens_per_minute counts them)."""
    if slot_ids and tokens > 0:
        RateSlot.objects.filter(pk__in=slot_ids).update(tokens=tokens)


def rate_slots_prune(*, now: datetime | None = None) -> int:
    """Delete the rows that left the window a window ago or more (the sweep calls it; a limit's window reads only
    its last 60 s, so a row's age past that changes nothing). The table holds only the last minutes' calls."""
    cutoff = now - 2 * WINDOW if now else db_clock(-2 * WINDOW.total_seconds())
    deleted, _ = RateSlot.objects.filter(started_at__lt=cutoff).delete()
    return deleted


def rate_use(*, now: datetime | None = None) -> list[dict]:
    """Each configured limit's use in the current window: for /ops/."""
    since = now - WINDOW if now else db_clock(-WINDOW.total_seconds())
    out = []
    for limit, spec in (settings.PAL_RATE_LIMITS or {}).items():
        window = RateSlot.objects.filter(key=limit, started_at__gt=since)
        out.append(
            {"limit": limit, **spec, "requests": window.count(), "tokens": window.aggregate(t=Sum("tokens"))["t"] or 0}
        )
    return out

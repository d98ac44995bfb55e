"""The walk's looks at operators' pauses (runs.models.Pause; created and resumed by runs.services.pauses): what holds a
run at the start of a slice, what holds a call to a peer, and the pace a paced resume keeps that peer's calls to."""

# Cost on the hot path: one indexed query per walk slice (pause_holding: the active pauses of the run, its workflow
# or the fleet, through the partial unique index pauses_one_active), and one per call to a peer (dependency_hold,
# beside the call's own rate-limit look), never one per step. A run that is walking when its pause is made parks at
# its next slice (PAL_SLICE_SECONDS); a step parks before its next call. Parking locks the pause's row FOR SHARE and
# looks again (pause_holds): a resume updates that row, so it waits for a parking in flight, and its look for the runs
# to wake, made after, sees every run that parked.

import math
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q

from pal.clock import db_clock, db_now

from .concurrency import key_lock
from .models import Pause, PauseScope, RateSlot, Run

# A paced call takes its slot just before it is sent and reaches the peer a moment later; counting the slots of a
# second and this margin keeps the peer's own seconds at the pace even when one call is slower than the next.
PACE_MARGIN = timedelta(milliseconds=250)


def dependency_of(channel: str, name: str) -> str:
    """The pause target of a call (a rate limit's channel and name): `llm:MODEL`, `webhook:HOST`, `email`."""
    return "email" if channel == "email" else f"{channel}:{name}"


def wait_of(pause: Pause, **more) -> dict:
    """The waiting_on of a run (or a step) that a pause holds: what `why` words without reading the pause."""
    return {
        "kind": "paused",
        "pause": str(pause.id),
        "scope": pause.scope,
        "target": pause.target,
        "by": pause.by,
        "reason": pause.reason,
        **more,
    }


def journal_payload(pause: Pause) -> dict:
    """The run_paused row of a held run: who paused what and why."""
    return {"pause": str(pause.id), "scope": pause.scope, "target": pause.target, "by": pause.by, "why": pause.reason}


def pause_holding(run: Run) -> Pause | None:
    """The active pause that holds this run (its own, its workflow's or the fleet's), oldest first; None when none."""
    scopes = (
        Q(scope=PauseScope.FLEET)
        | Q(scope=PauseScope.WORKFLOW, target=run.workflow.name)
        | Q(scope=PauseScope.RUN, target=str(run.id))
    )
    return Pause.objects.filter(scopes, resumed_at__isnull=True).order_by("created_at").first()


def dependency_hold(target: str) -> Pause | None:
    """The pause of a peer that holds its calls (active), or whose paced resume still paces them; None when none."""
    pacing = Q(pace_until__gt=db_clock())
    rows = Pause.objects.filter(Q(resumed_at__isnull=True) | pacing, scope=PauseScope.DEPENDENCY, target=target)
    return rows.order_by("-created_at").first()


def pause_holds(pause_id) -> bool:
    """Inside the parking's transaction: whether the pause is still active, its row locked FOR SHARE until the commit
    (a resume's update waits for it). SQLite has one writer at a time: there it is a plain read."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT resumed_at FROM pauses WHERE id = %s FOR SHARE", [pause_id])
            row = cursor.fetchone()
        return row is not None and row[0] is None
    return Pause.objects.filter(id=pause_id, resumed_at__isnull=True).exists()


def pace_take(pause: Pause, *, run_id, step_key: str) -> datetime | None:
    """A slot of a paced resume's pace for one call: None when it may start now, else when the next slot opens.
    At most per_second calls start in any second (and PACE_MARGIN); under 1 a second, one per 1/per_second s."""
    per_second = float(pause.per_second or 1.0)
    capacity = max(1, math.floor(per_second))
    window = timedelta(seconds=capacity / per_second) + PACE_MARGIN
    key = f"pace:{pause.id}"
    with transaction.atomic():
        key_lock(f"rate:{key}")
        now = db_now()  # once the lock is ours: a wait for it does not age the window's edge
        in_window = RateSlot.objects.filter(key=key, started_at__gt=now - window).order_by("started_at")
        taken = list(in_window.values_list("started_at", flat=True)[:capacity])
        if len(taken) >= capacity:
            return taken[0] + window + timedelta(milliseconds=10)
        RateSlot.objects.create(key=key, started_at=now, run_id=run_id, step_key=step_key)
    return None

"""Operators' pauses (docs/reference/api.md, "Pauses"): hold a run, a workflow's runs, the calls to one peer or the
whole fleet, and resume them, all at once or per_second of them a second. The walk's looks are in runs.pauses."""

import re
import uuid
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from pal.clock import db_clock, db_now

from ..audit import Audit
from ..concurrency import QUEUE_ORDER
from ..dispatch import enqueue_wake
from ..errors import Conflict, NotFound, ServiceError
from ..models import FINAL_STATUSES, Pause, PauseScope, Run, RunStatus, Workflow
from ..pauses import PACE_MARGIN
from ..waiting import WaitsInclude
from .wakeups import run_wake

DEPENDENCY_RE = re.compile(r"^(llm:[A-Za-z0-9._:/@+-]{1,200}|webhook:[A-Za-z0-9.-]{1,253}|email)$")
# After a paced resume of a peer, its calls keep to the pace for as long as releasing the held runs takes, half as
# long again (a busy fleet wakes them late) and this many seconds.
PACE_TAIL_SECONDS = 10.0


def _invalid(detail: str, code: str = "invalid_target") -> ServiceError:
    return ServiceError(detail, code=code, status=422)


def _target_of(scope: str, target: str) -> str:
    """The stored target of a pause, or 422/404/409 naming what is wrong with it."""
    target = (target or "").strip()
    if scope == PauseScope.FLEET:
        if target not in ("", "*"):
            raise _invalid(f'target: a fleet pause holds every run; give "*" or nothing, not {target!r}')
        return "*"
    if not target:
        raise _invalid(f"target: a {scope} pause needs a target")
    if scope == PauseScope.RUN:
        try:
            run_id = uuid.UUID(target)
        except ValueError:
            raise _invalid(f"target: a run pause's target is a run id, not {target!r}") from None
        status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
        if status is None:
            raise NotFound(f"run {target} does not exist", code="run_not_found")
        if status in FINAL_STATUSES:
            raise Conflict(f"run {target} has ended ({status}): there is nothing to pause", code="run_ended")
        return str(run_id)
    if scope == PauseScope.WORKFLOW:
        if not Workflow.objects.filter(name=target).exists():
            raise NotFound(f"workflow {target!r} does not exist", code="workflow_not_found")
        return target
    if scope == PauseScope.DEPENDENCY:
        if not DEPENDENCY_RE.match(target):
            raise _invalid(f"target: a dependency is llm:MODEL, webhook:HOST or email, not {target!r}")
        return target.lower() if target.startswith("webhook:") else target
    raise _invalid(f"scope: one of run, workflow, dependency, fleet, not {scope!r}", code="invalid_scope")


def pause_create(*, scope: str, target: str, by: str, reason: str) -> Pause:
    """Pause a run, a workflow, a dependency or the fleet. One active pause per target: a second is 409
    already_paused. What it holds parks at its next slice (a dependency: before its next call), journaled
    run_paused, and holds no lease and no worker until the resume."""
    audit = Audit.of(by=by, reason=reason, action="a pause")
    stored = _target_of(scope, target)
    try:
        with transaction.atomic():
            return Pause.objects.create(scope=scope, target=stored, by=audit.by, reason=audit.why)
    except IntegrityError:
        held = Pause.objects.filter(scope=scope, target=stored, resumed_at__isnull=True).first()
        raise Conflict(
            f"{scope} {stored} is paused already" + (f" (pause {held.id} by {held.by})" if held else ""),
            code="already_paused",
        ) from None


def pause_get(*, pause_id) -> Pause:
    try:
        pause = Pause.objects.filter(id=uuid.UUID(str(pause_id))).first()
    except ValueError:
        pause = None
    if pause is None:
        raise NotFound(f"pause {pause_id} does not exist", code="pause_not_found")
    return pause


def pause_list(*, active: bool | None = None, limit: int = 200) -> list[Pause]:
    """The pauses, active ones first, then the newest."""
    rows = Pause.objects.all()
    if active is not None:
        rows = rows.filter(resumed_at__isnull=active)
    return list(rows.order_by(F("resumed_at").desc(nulls_first=True), "-created_at")[:limit])


def held_by(pause_id) -> "Q":
    """A filter of the waiting runs that this pause holds (its wait first, or one of several)."""
    text = str(pause_id)
    return Q(status=RunStatus.WAITING) & (
        Q(waiting_on__kind="paused", waiting_on__pause=text) | Q(WaitsInclude("waiting_on", kind="paused", pause=text))
    )


def pause_held_count(*, pause_id) -> int:
    return Run.objects.filter(held_by(pause_id)).count()


def pause_resume(*, pause_id, by: str, reason: str, per_second: float | None = None) -> tuple[Pause, int]:
    """Resume a pause: (the pause, how many held runs it releases), woken now, or with per_second the i-th (the
    highest priority first, then the oldest) at a durable wake time i/per_second s after the resume by the database's
    clock, and a peer's calls keep to per_second a second (runs.pauses.pace_take) until pace_until. 409
    pause_resumed twice."""
    audit = Audit.of(by=by, reason=reason, action="a resume")
    if per_second is not None and not (0 < per_second <= 1000):
        raise _invalid(f"per_second: more than 0 and at most 1000, not {per_second!r}", code="invalid_per_second")
    pause = pause_get(pause_id=pause_id)
    with transaction.atomic():
        # The update waits for every parking in flight (each holds the row FOR SHARE: runs.pauses.pause_holds), so
        # the look for the held runs below, made after it, sees them all.
        resumed = Pause.objects.filter(id=pause.id, resumed_at__isnull=True).update(
            resumed_at=db_clock(), resumed_by=audit.by, resume_reason=audit.why, per_second=per_second
        )
        if resumed != 1:
            pause.refresh_from_db()
            raise Conflict(
                f"pause {pause.id} was resumed already, by {pause.resumed_by} at {pause.resumed_at}",
                code="pause_resumed",
            )
        # The highest priority first, then the oldest: the order a paced resume gives them their turns in.
        held = list(Run.objects.filter(held_by(pause.id)).order_by(*QUEUE_ORDER).values_list("id", flat=True))
        if per_second is not None:
            now = db_now()  # one reading of the database's clock: the turns are exactly 1/per_second apart
            for index, run_id in enumerate(held):
                seconds = index / per_second
                turn = now + timedelta(seconds=seconds)
                Run.objects.filter(id=run_id, status=RunStatus.WAITING).update(wake_at=turn)
                enqueue_wake(run_id=run_id, countdown=seconds)  # lost: the sweep wakes it once it is due
            if pause.scope == PauseScope.DEPENDENCY:
                pacing = len(held) / per_second * (1 + PACE_MARGIN.total_seconds()) * 1.5 + PACE_TAIL_SECONDS
                Pause.objects.filter(id=pause.id).update(pace_until=db_clock(pacing))
    if per_second is None:
        for run_id in held:
            run_wake(run_id=run_id, by=audit.by, why=resume_why(pause, audit.why), expect=_expect(pause))
    pause.refresh_from_db()
    return pause, len(held)


def _expect(pause: Pause) -> dict:
    return {"kind": "paused", "pause": str(pause.id)}


def resume_why(pause: Pause, reason: str) -> str:
    """The why of a held run's run_resumed."""
    target = "the fleet" if pause.scope == PauseScope.FLEET else f"{pause.scope} {pause.target}"
    return f"pause of {target} resumed: {reason}"

"""Why a run is not moving, in words: the run page's and the API's `why`, the runs list's state line and the
stuck runs of /ops/ grouped by cause. The queries they word are in runs.selectors."""

import json
from datetime import datetime
from typing import Any

from django.conf import settings

from journal.selectors import last_event
from pal.clock import db_now

from .decisions import assignee_text
from .models import FINAL_STATUSES, LIVE_STATUSES, Run, RunStatus
from .selectors import lease_of, parents_of_moved_children, stuck_lost_lease, stuck_timer_overdue


def _ago(moment: datetime, now: datetime) -> str:
    seconds = (now - moment).total_seconds()
    if seconds < 0:
        return f"in {-seconds:.0f}s"
    return f"{seconds:.0f}s ago"


def _at(moment) -> str:
    return moment.isoformat(timespec="seconds") if isinstance(moment, datetime) else str(moment)


def _waiting_sentence(run: Run) -> str:
    waiting = run.waiting_on
    if isinstance(waiting, dict):
        waits = waiting.get("waits")
        # A graph whose branches all wait: waiting_on is the first wait, "waits" every one of them.
        if isinstance(waits, list) and len(waits) > 1 and all(isinstance(w, dict) for w in waits):
            return "waiting on " + _and([_wait_words(w, run) or _raw(w) for w in waits])
        if waiting.get("kind") == "paused":
            released = f"; resumed, it goes on at {_at(run.wake_at)}" if run.wake_at else ""
            return _paused_words(waiting) + released
        words = _wait_words(waiting, run)
        if words:
            return f"waiting on {words}"
    if waiting:
        return f"waiting on {_raw(waiting)}"
    if run.wake_at:
        return f"waiting until {_at(run.wake_at)}"
    return "waiting, but it does not say on what (waiting_on is empty)"


def _approval_words(waiting: dict) -> str:
    """ "the approval of step 'review' (assigned to group billing), rejected by the engine at ... if nobody decides"."""
    words = f"the approval of step {waiting.get('step_id')!r}"
    assignee = assignee_text(waiting)
    if assignee:
        words += f" (assigned to {assignee})"
    if waiting.get("deadline"):
        on_timeout = waiting.get("on_timeout")
        outcome = "approved" if on_timeout == "approve" else "rejected"
        if isinstance(on_timeout, dict):
            outcome = "given its default answer"
        words += f", {outcome} by the engine at {_at(waiting['deadline'])} if nobody decides first"
    return words


def _wait_words(waiting: dict, run: Run) -> str | None:
    """One wait in words ("the approval of step 'legal'"); None for a kind these words do not know."""
    kind = waiting.get("kind")
    if kind == "approval":
        return _approval_words(waiting)
    if kind == "signal":
        return f"the signal {waiting.get('name')!r}" + (
            f" (step {waiting['step_id']!r})" if waiting.get("step_id") else ""
        )
    if kind in ("timer", "sleep"):
        until = waiting.get("until") or run.wake_at
        return f"a timer until {_at(until)}" if until else "a timer"
    if kind in ("child", "child_run"):
        child = waiting.get("child_run_id") or waiting.get("run_id")
        text = f"child run {child} (step {waiting.get('step_id')!r})"
        inner = waiting.get("child_waiting_on")
        if isinstance(inner, dict) and inner:
            text += ", which is " + _waiting_sentence(Run(waiting_on=inner, wake_at=None))
        return text
    if kind == "rate_limit":
        field = "requests_per_minute" if "requests_per_minute" in waiting else "tokens_per_minute"
        return (
            f"the rate limit {waiting.get('limit')} ({field} {waiting.get(field)}, step {waiting.get('step_id')!r}): "
            f"the next slot opens at {_at(waiting.get('until'))}"
        )
    if kind == "paused":
        return _paused_words(waiting)
    if kind == "budget":
        spent = waiting.get("spent") or {}
        caps = []
        if waiting.get("max_cost_usd") is not None:
            caps.append(f"${spent.get('cost_usd', 0):g} of max_cost_usd {waiting['max_cost_usd']:g}")
        if waiting.get("max_tokens") is not None:
            caps.append(f"{spent.get('tokens', 0)} of max_tokens {waiting['max_tokens']}")
        holder = waiting.get("run_id")
        whose = "its budget" if holder == str(run.id) else f"the budget of run {holder}"
        return f"{whose} ({', '.join(caps)} spent): raise it (POST /api/v1/runs/{holder}/budget) or cancel the run"
    if kind == "nondeterminism":
        journal, code = waiting.get("journal") or {}, waiting.get("code") or {}
        asked = f"{code.get('step_id')} ({code.get('kind')})" if code.get("step_id") else "to return"
        return (
            f"its code, which asks {asked} where the journal holds {journal.get('step_id')} ({journal.get('kind')}): "
            "mend the code and re-drive the run, or cancel it"
        )
    if kind == "code_missing":
        return (
            f"its Python workflow {waiting.get('code')}, which this worker has not loaded: add its module to "
            "PAL_WORKFLOW_MODULES on every worker and re-drive the run"
        )
    return None


def _paused_words(waiting: dict) -> str:
    """A pause's hold in words: "paused: email by alice: smtp outage" (a step's, with the step)."""
    scope, target = waiting.get("scope"), waiting.get("target")
    what = {"run": "this run", "workflow": f"workflow {target}", "fleet": "the fleet"}.get(str(scope), str(target))
    step = f" (step {waiting['step_id']!r} before its call)" if waiting.get("step_id") else ""
    return f"paused: {what} by {waiting.get('by')}: {waiting.get('reason')}{step}"


def _raw(waiting) -> str:
    return json.dumps(waiting, default=str)


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


_UNSET: Any = object()


def _moved_child(run: Run, *, now: datetime | None) -> str | None:
    """For a run parked on a child that no longer waits and that nothing drives (the sweep's rule,
    runs.recovery.parents_of_moved_children): the child's state in words; else None."""
    if not isinstance(run.waiting_on, dict) or run.waiting_on.get("kind") != "child":
        return None
    for _parent, _child, status, ended in parents_of_moved_children(now=now, limit=1, parent_id=run.id):
        return status if ended else f"{status} with no live lease"
    return None


def run_why(run: Run, *, lease: dict | None = _UNSET, last: Any = _UNSET, now: datetime | None = None) -> str | None:
    """In words, why a run that has not ended is not moving (or what it is doing); None for an ended run.

    lease and last (its last journal row), when the caller knows them, save reading them. now: a value of the
    database's clock (pal.clock), read when needed if not given."""
    if run.status in FINAL_STATUSES:
        return None
    if run.status == RunStatus.WAITING:
        moved = _moved_child(run, now=now)
        if moved:
            return (
                f"{_waiting_sentence(run)}, but that child is {moved} and nothing drives it, so this run is "
                f"stuck: the recovery sweep wakes it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
            )
        return _waiting_sentence(run)
    held = run.waiting_on if isinstance(run.waiting_on, dict) else {}
    if run.status == RunStatus.QUEUED and held.get("kind") == "concurrency":
        return (
            f"concurrency {held.get('key')}: {held.get('running')} of {held.get('max_runs')} running; it starts "
            "when a slot frees (the next run of the group to end or wait hands it on, in creation order)"
        )
    if lease is _UNSET:
        lease = lease_of(run)
    sweep = f"the recovery sweep re-drives it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
    if lease is None:
        if run.status == RunStatus.QUEUED:
            return f"queued with no lease and no task booked for it: {sweep}"
        return f"no lease: no worker holds it and no task is booked for it; {sweep}"
    owner, epoch, expires = lease["owner"], lease["epoch"], lease["expires_at"]
    now = now or db_now()
    expired = expires < now
    if owner.startswith("task:"):
        task = owner.removeprefix("task:")
        if expired:
            return (
                f"its booking for task {task} (epoch {epoch}) expired at {_at(expires)} ({_ago(expires, now)}) "
                f"and no worker took it (the message was lost or no worker runs): {sweep}"
            )
        last = last_event(run_id=run.id) if last is _UNSET else last
        if last is not None and last.kind == "run_backoff":
            return (
                f"backing off before the next attempt of step {last.step_id!r}: booked for task {task} "
                f"(epoch {epoch}), due {_at((last.payload or {}).get('until') or expires)}"
            )
        return (
            f"queued for task {task} (epoch {epoch}): waiting for a worker to take it; if none does by "
            f"{_at(expires)}, {sweep}"
        )
    if expired:
        return (
            f"lease expired: held by {owner} (epoch {epoch}), expired at {_at(expires)} ({_ago(expires, now)}) "
            f"without a heartbeat, so that worker has probably died; {sweep}"
        )
    last = last_event(run_id=run.id) if last is _UNSET else last
    doing = ""
    if last is not None and last.kind == "step_started":
        doing = f", inside step {last.step_id!r} (attempt {last.attempt}) since {_at(last.created_at)}"
    elif last is not None and last.step_id:
        doing = f", last event {last.kind} of step {last.step_id!r} at {_at(last.created_at)}"
    return f"held by {owner} (epoch {epoch}) until {_at(expires)}{doing}"


def run_state_line(run: Run, *, lease: dict | None, now: datetime) -> str:
    """The run list's one line of state, from what the list read already (its lease by select_related): no
    query per row, so unlike run_why it does not look at the journal."""
    if run.status == RunStatus.WAITING:
        moved = _moved_child(run, now=now)
        if moved:
            return (
                f"{_waiting_sentence(run)}, but that child is {moved} and nothing drives it, so this run is "
                f"stuck: the recovery sweep wakes it at its next pass (every {settings.PAL_RECOVERY_INTERVAL:g}s)"
            )
        return _waiting_sentence(run)
    if run.status in LIVE_STATUSES:
        if lease is None:
            return "no lease: the sweep will re-drive it"
        left = (lease["expires_at"] - now).total_seconds()
        booked = lease["owner"].startswith("task:")
        if left < 0:
            if booked:
                return f"booked for a task that no worker took; the booking expired {-left:.0f}s ago"
            return f"lease of {lease['owner']} (epoch {lease['epoch']}) expired {-left:.0f}s ago: its worker died?"
        if booked:
            return f"queued for a worker (booking expires in {left:.0f}s)"
        return f"held by {lease['owner']} (epoch {lease['epoch']}), expires in {left:.0f}s"
    if run.status == RunStatus.FAILED and isinstance(run.error, dict):
        return f"{run.error.get('step_id') or ''}: {run.error.get('message') or run.error.get('code') or ''}"
    return ""


STUCK_CAUSES = {
    "lease_expired": "lease expired: its worker stopped heartbeating (probably died)",
    "booking_expired": "booked for a task nobody took (the message was lost, or no worker runs)",
    "no_lease": "no lease and no task booked",
    "timer_overdue": "a durable timer is due and has not woken it",
    "child_moved": "parked on a child that no longer waits and that nothing drives",
}


def stuck_runs_grouped(*, limit: int = 500, now: datetime | None = None) -> list[dict]:
    """The stuck runs (runs.selectors.stuck_runs, cause by cause) grouped by why: [{cause, label, runs: [{run,
    lease, why}]}]. One query per cause; why is worded from the lease read with the run."""
    now = now or db_now()
    groups: dict[str, list] = {cause: [] for cause in STUCK_CAUSES}
    for run in stuck_lost_lease(now=now).select_related("workflow", "lock").order_by("updated_at")[:limit]:
        lease = lease_of(run)
        if lease is None:
            cause = "no_lease"
        elif lease["owner"].startswith("task:"):
            cause = "booking_expired"
        else:
            cause = "lease_expired"
        groups[cause].append({"run": run, "lease": lease, "why": run_why(run, lease=lease, now=now)})
    overdue = stuck_timer_overdue(now=now).select_related("workflow").order_by("wake_at")[:limit]
    for run in overdue:
        groups["timer_overdue"].append({"run": run, "lease": None, "why": run_why(run, now=now)})
    parents = [moved[0] for moved in parents_of_moved_children(now=now, limit=limit)]
    for run in Run.objects.select_related("workflow").filter(id__in=parents).order_by("updated_at"):
        groups["child_moved"].append({"run": run, "lease": None, "why": run_why(run, now=now)})
    return [{"cause": cause, "label": STUCK_CAUSES[cause], "runs": runs} for cause, runs in groups.items() if runs]

"""approval, signal, sleep: steps that park the run (status waiting, no lease, no worker) until something
outside wakes it: a decision, a signal, a timer. They raise Wait; runs.walk journals it and releases the run.
"""

from datetime import datetime, timedelta

from django.utils.dateparse import parse_datetime

from pal.clock import db_now

from ..errors import StepError, Wait
from .base import NAME_RE, StepKind, register


@register
class Approval(StepKind):
    kind = "approval"
    required = ("prompt",)
    templated = ("prompt",)

    def validate(self, step):
        return (
            [] if isinstance(step.get("prompt"), str) and step["prompt"] else [("prompt", "must be a non-empty string")]
        )

    def run(self, step, ctx):
        decided = ctx.find("approval_decided")
        if decided is not None and decided.get("attempt", ctx.attempt) not in (ctx.attempt, None):
            decided = None  # a decision for another attempt of this step (a late one) never decides this one
        if decided is not None:
            if decided.get("approved"):
                return {"approved": True, "by": decided.get("by"), "comment": decided.get("comment", "")}
            raise StepError(
                f"rejected by {decided.get('by')}: {decided.get('comment') or 'no comment'}",
                code="approval_rejected",
                details={"by": decided.get("by"), "comment": decided.get("comment", "")},
            )
        waiting_on = {"kind": "approval", "step_id": ctx.step_id, "attempt": ctx.attempt, "prompt": step["prompt"]}
        journal = [] if ctx.find("approval_requested") else [("approval_requested", {"prompt": step["prompt"]})]
        raise Wait(waiting_on, journal=journal)


@register
class SignalWait(StepKind):
    kind = "signal"
    required = ("name",)

    def validate(self, step):
        return (
            []
            if isinstance(step.get("name"), str) and NAME_RE.match(step["name"])
            else [("name", "must be 1-64 characters of a-z 0-9 - _")]
        )

    def run(self, step, ctx):
        received = ctx.find("signal_received")
        if received is not None:
            return received.get("payload")
        found, payload = ctx.consume_signal(step["name"])
        if found:
            return payload
        raise Wait({"kind": "signal", "step_id": ctx.step_id, "attempt": ctx.attempt, "name": step["name"]})


@register
class Sleep(StepKind):
    kind = "sleep"
    required = ("seconds",)

    def validate(self, step):
        seconds = step.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 366 * 86_400:
            return [("seconds", "must be a number of seconds from 0 to 31622400")]
        return []

    def run(self, step, ctx):
        waited = ctx.find("run_waiting")
        until = parse_datetime(waited["waiting_on"]["until"]) if waited else None
        now = db_now()  # the one clock every host agrees on (pal.clock)
        if until is None:
            until = now + timedelta(seconds=step["seconds"])
        if now >= until:
            return {"slept": step["seconds"]}
        raise Wait(
            {"kind": "timer", "step_id": ctx.step_id, "attempt": ctx.attempt, "until": until.isoformat()}, wake_at=until
        )


__all__ = ["Approval", "SignalWait", "Sleep", "datetime"]

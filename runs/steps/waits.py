"""approval, signal, sleep: steps that park the run (status waiting, no lease, no worker) until something
outside wakes it: a decision, a signal, a timer. They raise Wait; runs.walk journals it and releases the run.
"""

from datetime import datetime, timedelta

from django.utils.dateparse import parse_datetime

from ..decisions import approval_problems, decision_output, request_of
from ..errors import Wait
from .base import NAME_RE, StepKind, register
from .notify import notify_send


@register
class Approval(StepKind):
    kind = "approval"
    required = ("prompt",)
    optional = ("form", "choices", "assign", "on_timeout", "notify", "link_decides")
    templated = ("prompt", "assign", "notify")

    def validate(self, step):
        problems = (
            [] if isinstance(step.get("prompt"), str) and step["prompt"] else [("prompt", "must be a non-empty string")]
        )
        return problems + approval_problems(step)

    def run(self, step, ctx):
        decided = ctx.find("approval_decided")
        if decided is not None and decided.get("attempt", ctx.attempt) not in (ctx.attempt, None):
            decided = None  # a decision for another attempt of this step (a late one) never decides this one
        if decided is not None:
            return decision_output(step, decided)
        requested = ctx.find("approval_requested")
        asked = requested if requested is not None else self.request(step, ctx)
        waiting_on = {
            "kind": "approval",
            "step_id": ctx.step_id,
            "attempt": ctx.attempt,
            "prompt": step["prompt"],
            **{k: v for k, v in asked.items() if k != "prompt" and k != "notify"},
        }
        deadline = parse_datetime(asked["deadline"]) if asked.get("deadline") else None
        if step.get("notify"):
            if requested is None:
                ctx.open_request(asked)  # journaled before the notification goes out: its link can decide at once
                requested = asked
            notify_send(step, ctx, asked)
        # At the deadline the engine decides (runs.services.run_wake_timer, by "timeout"): the wait is a timer too.
        raise Wait(
            waiting_on, wake_at=deadline, journal=[] if requested is not None else [("approval_requested", asked)]
        )

    @staticmethod
    def request(step: dict, ctx) -> dict:
        """The approval_requested of a new wait: its prompt and, when it has typed fields, a timeout or notify, those,
        when it opened (the database's clock) and its deadline."""
        asked = {"prompt": step["prompt"], **request_of(step)}
        if len(asked) == 1 and not ctx.timeout and not step.get("notify"):
            return asked  # a plain approval's request is its prompt, as it always was (the inbox ages it by the run)
        opened = ctx.clock()
        asked["opened_at"] = opened.isoformat()
        if ctx.timeout:
            asked["deadline"] = (opened + timedelta(seconds=float(ctx.timeout))).isoformat()
            asked["timeout_seconds"] = ctx.timeout
        if step.get("notify"):
            asked["notify"] = sorted(step["notify"])
        return asked


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
        now = ctx.clock()  # the one clock every host agrees on (pal.clock), read on the walk's thread
        if until is None:
            until = now + timedelta(seconds=step["seconds"])
        if now >= until:
            return {"slept": step["seconds"]}
        raise Wait(
            {"kind": "timer", "step_id": ctx.step_id, "attempt": ctx.attempt, "until": until.isoformat()}, wake_at=until
        )


__all__ = ["Approval", "SignalWait", "Sleep", "datetime"]

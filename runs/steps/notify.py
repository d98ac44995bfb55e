"""An approval's `notify`: when the decision opens, an email and / or a signed webhook with the link that opens it,
each through the deliver step's own code and claim (runs.steps.deliver), under a key of its own,
`{run}:{step}:{attempt}:notify-email` / `:notify-webhook`: once per decision, across crashes and re-drives."""

import dataclasses
import functools
import logging
from typing import Any

from django.utils.dateparse import parse_datetime

from ..decision_links import link_token, link_url
from ..decisions import assignee_text
from ..errors import StepError
from .base import StepContext
from .deliver import Deliver

log = logging.getLogger("pal.steps")


def notify_key(key: str, channel: str) -> str:
    """The side effect's key of one notification of a step attempt."""
    return f"{key}:notify-{channel}"


def notify_send(fields: dict, ctx: StepContext, asked: dict) -> None:
    """Send what has not gone out yet of the approval's notifications (a delivered one is not sent again; an email
    claimed before a crash is left unconfirmed for an operator, never sent twice). A notification that fails does
    not fail the approval: journaled `approval_notify_failed`, its claim stays on /ops/."""
    opened_at = parse_datetime(asked["opened_at"])
    assert opened_at is not None
    token = link_token(run_id=ctx.run_id, step_id=ctx.step_id, attempt=ctx.attempt, opened_at=opened_at)
    link = link_url(token)
    about = {
        "event": "decision_opened",
        "run_id": ctx.run_id,
        "step_id": ctx.step_id,
        "attempt": ctx.attempt,
        "prompt": fields["prompt"],
        "url": link,
        "link_decides": bool(fields.get("link_decides")),
        "assignee": assignee_text(asked),
        "deadline": asked.get("deadline"),
        "choices": asked.get("choices"),
        "form": asked.get("form"),
    }
    notify = fields.get("notify") or {}
    deliver = Deliver()
    for channel in ("email", "webhook"):
        if channel not in notify:
            continue
        key = notify_key(ctx.key, channel)
        # The deliver step's context with this notification's key (its claim, its Idempotency-Key or Message-ID) and
        # no deadline of the approval's.
        sub = dataclasses.replace(
            ctx, key=key, claim=functools.partial(ctx.claim, key=key), timeout=None, deadline=None
        )
        try:
            if channel == "webhook":
                deliver.webhook({"url": notify["webhook"], "body": about}, sub)
            else:
                deliver.email({"to": notify["email"], "subject": _subject(fields), "body": _text(about)}, sub)
        except StepError as exc:
            log.warning("run %s: the %s notification of approval %s failed: %s", ctx.run_id, channel, ctx.step_id, exc)
            ctx.emit("approval_notify_failed", {"channel": channel, "key": key, "error": exc.as_payload()})


def _subject(fields: dict) -> str:
    prompt = " ".join(str(fields["prompt"]).split())
    return f"Decision needed: {prompt[:120]}"


def _text(about: dict[str, Any]) -> str:
    lines = [str(about["prompt"]), ""]
    if about["assignee"]:
        lines.append(f"Assigned to {about['assignee']}.")
    if about["deadline"]:
        lines.append(f"Decided by the engine at {about['deadline']} if nobody decides before.")
    verb = "Decide it here (no login needed, once)" if about["link_decides"] else "Open it here"
    lines += [f"{verb}: {about['url']}", "", f"Run {about['run_id']}, step {about['step_id']}."]
    return "\n".join(lines)

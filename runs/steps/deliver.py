"""deliver: a webhook or an email, claimed by key before it is sent so that a repeat never sends twice.

On a re-drive that finds the claim but no confirmation: a webhook is sent again with the same
Idempotency-Key (the receiver dedups), an email is not sent again but marked unconfirmed for an operator,
and the run goes on.
"""

import hashlib
import hmac
import json
import smtplib
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import EmailMessage, mailers

from ..errors import StepError
from ..models import SideEffectStatus
from ..transport import Unanswered, send_with_tries
from .base import StepKind, register


def message_id_for(key: str) -> str:
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:40]}@pal.invalid>"


def signature_for(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@register
class Deliver(StepKind):
    kind = "deliver"
    required = ("channel", "body")
    optional = ("url", "to", "subject")
    templated = ("url", "to", "subject", "body")

    def validate(self, step):
        channel = step.get("channel")
        errors = []
        if channel == "webhook":
            url = step.get("url")
            if not isinstance(url, str) or not (
                url.startswith("http://") or url.startswith("https://") or url.startswith("{{")
            ):
                errors.append(("url", "must be an http:// or https:// URL"))
            for key in ("to", "subject"):
                if key in step:
                    errors.append((key, "is for the email channel, not webhook"))
        elif channel == "email":
            to = step.get("to")
            if not (isinstance(to, list) and to and all(isinstance(a, str) and ("@" in a or "{{" in a) for a in to)):
                errors.append(("to", "must be a non-empty list of email addresses"))
            if not isinstance(step.get("subject"), str):
                errors.append(("subject", "is required and must be a string"))
            if not isinstance(step.get("body"), str):
                errors.append(("body", "must be a string for email"))
            if "url" in step:
                errors.append(("url", "is for the webhook channel, not email"))
        else:
            errors.append(("channel", "must be webhook or email"))
        return errors

    def run(self, step, ctx):
        if step["channel"] == "webhook":
            return self.webhook(step, ctx)
        return self.email(step, ctx)

    # --- deadlines -------------------------------------------------------------------------------

    @staticmethod
    def try_timeout(ctx, default: float) -> float:
        """One try's network timeout: the step's timeout_seconds (else the channel's default), and never past
        the step's deadline."""
        budget = float(ctx.timeout or default)
        left = ctx.time_left()
        return budget if left is None else max(min(budget, left), 0.001)

    @staticmethod
    def check_deadline(ctx, effect):
        """ctx.check_lease() before a try, then the lease in the database (a cancelled or stolen run sends nothing
        more). A deadline spent before anything was sent is a definite step_timeout: the claim is closed as never
        sent, so that a retry's new key is honest. After a send it is an unknown outcome
        (StepContext.check_lease), and the claim stays for the same key."""
        try:
            ctx.check_lease()
        except StepError as exc:
            if exc.permanent:
                ctx.confirm(effect, status=SideEffectStatus.FAILED, response={"reason": f"never sent: {exc.message}"})
            raise
        ctx.lease_held()

    # --- webhook ---------------------------------------------------------------------------------

    def webhook(self, step, ctx):
        url = step["url"]
        effect, created = ctx.claim(channel="webhook", target=url)
        if not created:
            if effect.status == SideEffectStatus.DELIVERED:
                return {"channel": "webhook", "key": ctx.key, "status": "delivered"}
            if effect.status == SideEffectStatus.FAILED:
                raise StepError(
                    f"webhook {url} refused key {ctx.key} earlier", code="webhook_refused", details=effect.response
                )
            # claimed but never confirmed: send again with the same key; the receiver dedups.
            ctx.sent = True  # an earlier run of this attempt may have sent it: its outcome is not definite now
        body = json.dumps(step["body"], separators=(",", ":"), sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": ctx.key}
        if settings.PAL_WEBHOOK_SECRET:
            headers["X-PAL-Signature"] = signature_for(body, settings.PAL_WEBHOOK_SECRET)

        def before_try():
            self.check_deadline(ctx, effect)
            ctx.rate_limit("webhook", urlsplit(url).hostname or "")  # or waits durably for the limit's next slot
            ctx.sent = True  # from here the receiver may take it, whatever we hear back

        def send():
            timeout = self.try_timeout(ctx, settings.PAL_WEBHOOK_TIMEOUT)
            return httpx.post(url, content=body, headers=headers, timeout=timeout)

        try:
            response = send_with_tries(send, before_try=before_try, pause=ctx.pause)
        except Unanswered as exc:
            # Timeouts, lost connections, 5xx: the receiver may have it. Unknown, never a definite failure: the
            # same key goes again (in a later run of this attempt).
            raise StepError(
                f"webhook {url} did not answer after {exc.tries} tries with key {ctx.key}: {exc.problem}",
                permanent=False,
                code="webhook_unavailable",
            ) from None
        if response.status_code < 300:
            ctx.confirm(effect, status=SideEffectStatus.DELIVERED, response={"status": response.status_code})
            return {"channel": "webhook", "key": ctx.key, "status": "delivered"}
        detail = {"status": response.status_code, "body": response.text[:200]}
        ctx.confirm(effect, status=SideEffectStatus.FAILED, response=detail)
        raise StepError(
            f"webhook {url} refused the delivery: HTTP {response.status_code}", code="webhook_refused", details=detail
        )

    # --- email -----------------------------------------------------------------------------------

    def email(self, step, ctx):
        to = step["to"] if isinstance(step["to"], list) else [step["to"]]
        # Before the claim: a claimed email is never sent again, so waiting for a slot must come first.
        ctx.rate_limit("email", "*")
        effect, created = ctx.claim(channel="email", target=", ".join(map(str, to)))
        if not created:
            if effect.status == SideEffectStatus.DELIVERED:
                return {"channel": "email", "key": ctx.key, "status": "delivered"}
            if effect.status == SideEffectStatus.FAILED:
                raise StepError(
                    f"the mail server refused key {ctx.key} earlier", code="email_refused", details=effect.response
                )
            if effect.status == SideEffectStatus.CLAIMED:
                # It may have gone out before the crash: never send twice; an operator decides.
                ctx.confirm(
                    effect,
                    status=SideEffectStatus.UNCONFIRMED,
                    response={"reason": "claimed before a crash; not sent again"},
                )
            return {"channel": "email", "key": ctx.key, "status": "unconfirmed"}
        message = EmailMessage(
            subject=str(step.get("subject", "")),
            body=step["body"] if isinstance(step["body"], str) else json.dumps(step["body"]),
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[str(a) for a in to],
            headers={"Message-ID": message_id_for(ctx.key), "X-PAL-Idempotency-Key": ctx.key},
        )
        tries = settings.PAL_TRANSPORT_RETRIES + 1
        for number in range(1, tries + 1):
            # Before each try nothing has left (a refused connection sends nothing), so a spent deadline here
            # is a definite step_timeout; a timeout once connected is OSError below: unconfirmed, never resent.
            self.check_deadline(ctx, effect)
            connection = mailers.default
            if hasattr(connection, "timeout"):  # SMTP: each try gets what is left of the step's deadline
                connection.timeout = self.try_timeout(ctx, settings.PAL_EMAIL_TIMEOUT)
            try:
                connection.send_messages([message])
            except (ConnectionRefusedError, smtplib.SMTPConnectError) as exc:
                problem = f"{type(exc).__name__}: {exc}"  # nothing was sent: safe to try again
                if number < tries:
                    ctx.pause(min(0.2 * 2 ** (number - 1), 5))
                continue
            except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as exc:
                detail = {"error": f"{type(exc).__name__}: {exc}"}
                ctx.confirm(effect, status=SideEffectStatus.FAILED, response=detail)
                raise StepError(
                    f"the mail server refused the message: {exc}", code="email_refused", details=detail
                ) from None
            except (OSError, smtplib.SMTPException) as exc:
                # The message may or may not have left: do not send it again.
                ctx.confirm(
                    effect, status=SideEffectStatus.UNCONFIRMED, response={"error": f"{type(exc).__name__}: {exc}"}
                )
                return {"channel": "email", "key": ctx.key, "status": "unconfirmed"}
            ctx.confirm(effect, status=SideEffectStatus.DELIVERED, response={"message_id": message_id_for(ctx.key)})
            return {"channel": "email", "key": ctx.key, "status": "delivered"}
        raise StepError(
            f"the mail server did not accept a connection after {tries} tries: {problem}",
            permanent=False,
            code="email_unavailable",
        )

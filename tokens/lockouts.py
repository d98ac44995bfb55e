"""Who is locked out now (django-axes' attempts): user names and addresses refused after too many failures."""

from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

TOKEN_PREFIX = "api token from "  # tokens.auth counts a bad token under this name, per address


def lockouts_active(*, now=None, limit: int = 50) -> list[dict]:
    """The attempts at or past the failure limit within the cool-off: [{who, kind, failures, last_at, until}],
    newest first. kind: "login" (a user name or an address at the login page) or "api token" (an address)."""
    now = now or timezone.now()
    since = now - settings.AXES_COOLOFF_TIME
    rows = (
        AccessAttempt.objects.filter(failures_since_start__gte=settings.AXES_FAILURE_LIMIT, attempt_time__gte=since)
        .filter(~Q(username="") | Q(ip_address__isnull=False))
        .order_by("-attempt_time")[:limit]
    )
    found = []
    for row in rows:
        token = (row.username or "").startswith(TOKEN_PREFIX)
        who = row.ip_address if token else (row.username or row.ip_address or "")
        found.append(
            {
                "who": who,
                "address": row.ip_address,
                "kind": "api token" if token else "login",
                "failures": row.failures_since_start,
                "last_at": row.attempt_time,
                "until": row.attempt_time + settings.AXES_COOLOFF_TIME,
            }
        )
    return found

"""Issuing, checking and revoking API tokens.

A token is "pal_" + 43 URL-safe characters (256 random bits). The database keeps its SHA-256 only: a leaked
table gives nobody a usable token, and a lookup is one indexed equality on the hash.
"""

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from .models import ApiToken

TOKEN_PREFIX = "pal_"
SHOWN_PREFIX = 12  # "pal_" + 8 characters, kept to recognise a token in the admin
LAST_USED_GRANULARITY = timedelta(seconds=60)  # at most one write per token per minute


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(*, user, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for user. Returns (row, token); the token itself is not stored anywhere."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name, prefix=token[:SHOWN_PREFIX], token_hash=token_hash(token))
    return row, token


def token_create_for_username(*, username: str, name: str = "") -> tuple[ApiToken, str]:
    user = get_user_model().objects.get_by_natural_key(username)
    return token_create(user=user, name=name)


def token_authenticate(token: str):
    """The active user behind a live token, or None. Notes when the token was last used (once a minute)."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = ApiToken.objects.active().select_related("user").filter(token_hash=token_hash(token)).first()
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or row.last_used_at < now - LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def token_revoke(*, token_id: int) -> bool:
    """Revoke a token; False when it was already revoked. The row stays, for the record."""
    return bool(ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(revoked_at=timezone.now()))

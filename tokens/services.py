"""Issuing, checking and revoking API tokens.

A token is "pal_" + 43 URL-safe characters (256 random bits). The database keeps its SHA-256 only: a leaked
table gives nobody a usable token, and a lookup is one indexed equality on the hash.
"""

import hashlib
import json
import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from pal import rows
from pal.clock import db_clock, db_clock_sql

from .models import ApiToken

TOKEN_PREFIX = "pal_"
SHOWN_PREFIX = 12  # "pal_" + 8 characters, kept to recognise a token in the admin
LAST_USED_GRANULARITY = timedelta(seconds=60)  # at most one write per token per minute


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(*, user, name: str = "", expires_in: timedelta | None = None) -> tuple[ApiToken, str]:
    """Make a token for user, refused once expires_in has passed (None: never). Returns (row, token); the token
    itself is not stored anywhere."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    row = ApiToken.objects.create(
        user=user, name=name, prefix=token[:SHOWN_PREFIX], token_hash=token_hash(token), expires_at=expires_at
    )
    return row, token


def token_create_for_username(
    *, username: str, name: str = "", expires_in: timedelta | None = None
) -> tuple[ApiToken, str]:
    user = get_user_model().objects.get_by_natural_key(username)
    return token_create(user=user, name=name, expires_in=expires_in)


_LIFETIME = re.compile(r"^\s*([0-9]{1,6})\s*([mhdw])\s*$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def token_lifetime(text: str) -> timedelta:
    """ "30d", "12h", "90m", "2w" as a timedelta; ValueError naming the forms otherwise."""
    match = _LIFETIME.match(text or "")
    if match is None or int(match[1]) == 0:
        raise ValueError(f"{text!r} is not a lifetime: a whole number and m, h, d or w, such as 30d or 12h")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def token_authenticate(token: str):
    """The active user behind a live token, or None. Notes when the token was last used: at most once a
    LAST_USED_GRANULARITY, judged and stamped by the database's clock."""
    return token_authenticate_with(token, None, [])[0]


def token_authenticate_with(token: str, read: rows.Read | None, params: list) -> tuple[Any, Any]:
    """token_authenticate's user, and what read.one(params) gives, read in the same statement as the token (one
    round trip): (user, instance or None); (None, None) when the token is refused. read None: the token alone."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None, None
    digest = token_hash(token)
    if read is None:
        row, found = _live_token(digest), None
    else:
        row, found = rows.read_both(_token_read(), _token_params(digest), read, params)
    if row is None:
        return None, None
    if row.__dict__["stamp_due"]:  # set by the read (rows.Read's extra), as permissions_found is
        # Only while still due: of the calls that read it due at once, one writes.
        due = Q(last_used_at__isnull=True) | Q(last_used_at__lt=db_clock(-LAST_USED_GRANULARITY.total_seconds()))
        ApiToken.objects.filter(due, pk=row.pk).update(last_used_at=db_clock())
    _permissions_fill(row.user, row.__dict__["permissions_found"])
    return row.user, found


def _live_token(digest: str) -> ApiToken | None:
    """ApiToken.objects.active().select_related("user").filter(token_hash=digest).first(), as SQL built once, with
    the user's permissions in the same read (row.permissions_found, see _permissions_fill): every API call makes
    this read first, and compiling that queryset took longer than Postgres took to answer it."""
    return _token_read().one(_token_params(digest))


def _token_params(digest: str) -> list:
    return [*_stamp_due_before()[1], digest, True]


def _token_read() -> rows.Read:
    """_live_token's read, built once per database vendor."""
    read = _token_reads.get(connection.vendor)
    if read is None:
        user_model: Any = get_user_model()
        qn, user = connection.ops.quote_name, ApiToken._meta.get_field("user")
        superuser = f"u.{qn(user_model._meta.get_field('is_superuser').column)}"
        stamped = f"t.{qn(str(ApiToken._meta.get_field('last_used_at').column))}"
        read = _token_reads[connection.vendor] = rows.Read(
            ApiToken,
            "t",
            joined={"user": "u"},
            extra={
                # A superuser's role check reads no permission: nor does this read.
                "permissions_found": f"CASE WHEN {superuser} THEN NULL ELSE {_permissions_of_user()} END",
                # Whether last_used_at is due a new stamp, by the database's clock (its one parameter).
                "stamp_due": f"CASE WHEN {stamped} IS NULL OR {stamped} < {_stamp_due_before()[0]} THEN 1 ELSE 0 END",
            },
            tail=f"FROM {qn(ApiToken._meta.db_table)} t JOIN {qn(user_model._meta.db_table)} u "
            f"ON u.{qn(user_model._meta.pk.column)} = t.{qn(str(user.column))} "
            "WHERE t.token_hash = %s AND t.revoked_at IS NULL "
            # The database's clock decides an expiry, as it does every other deadline.
            "AND (t.expires_at IS NULL OR t.expires_at > CURRENT_TIMESTAMP) "
            f"AND u.{qn(user_model._meta.get_field('is_active').column)} = %s",
        )
    return read


def _stamp_due_before() -> tuple[str, list]:
    """(SQL, params) of the moment before which a last use is stamped again: the database's clock less
    LAST_USED_GRANULARITY (one parameter on every vendor, so the read's text is built once)."""
    return db_clock_sql(-LAST_USED_GRANULARITY.total_seconds())


_token_reads: dict[str, rows.Read] = {}  # per database vendor (the permissions' list is written per vendor)


_MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"
# Backends that answer no permission question (django-axes' only refuses a locked-out login): beside ModelBackend
# they leave has_perm to it alone, so its caches can be filled from the token read.
_NO_PERMISSIONS = frozenset({"axes.backends.AxesStandaloneBackend"})


def _permissions_fill(user, found) -> None:
    """Put what ModelBackend.has_perm would read (the user's own permissions and its groups', two ORM queries on
    every API call since the user is new each time), as the token read found them, into the two caches ModelBackend
    looks in before it reads: the role check (tokens.auth) then answers from them."""
    backends = [path for path in settings.AUTHENTICATION_BACKENDS if path not in _NO_PERMISSIONS]
    if user.is_superuser or found is None or backends != [_MODEL_BACKEND]:
        return  # a superuser's check reads nothing; another backend reads its own way
    if isinstance(found, str):
        found = json.loads(found)  # SQLite's json_group_array
    user._user_perm_cache = {name.removeprefix("user ") for name in found if name.startswith("user ")}
    user._group_perm_cache = {name.removeprefix("group ") for name in found if name.startswith("group ")}


def _permissions_of_user() -> str:
    """SQL of the token read's user `u`'s permissions, own ("user app.codename") and its groups' ("group
    app.codename"), as one value: an array in Postgres, a JSON array in SQLite."""
    user_model: Any = get_user_model()
    qn = connection.ops.quote_name
    own: Any = user_model._meta.get_field("user_permissions")
    groups: Any = user_model._meta.get_field("groups")
    group_perms: Any = groups.related_model._meta.get_field("permissions")
    user_id = f"u.{qn(user_model._meta.pk.column)}"
    perm = f"FROM {qn(Permission._meta.db_table)} p JOIN {qn(ContentType._meta.db_table)} ct"
    perm += " ON ct.id = p.content_type_id"
    name = "ct.app_label || '.' || p.codename"
    both = (
        f"SELECT 'user ' || {name} AS name {perm} "
        f"JOIN {qn(own.m2m_db_table())} up ON up.{qn(own.m2m_reverse_name())} = p.id "
        f"WHERE up.{qn(own.m2m_column_name())} = {user_id} "
        f"UNION ALL SELECT 'group ' || {name} AS name {perm} "
        f"JOIN {qn(group_perms.m2m_db_table())} gp ON gp.{qn(group_perms.m2m_reverse_name())} = p.id "
        f"JOIN {qn(groups.m2m_db_table())} ug "
        f"ON ug.{qn(groups.m2m_reverse_name())} = gp.{qn(group_perms.m2m_column_name())} "
        f"WHERE ug.{qn(groups.m2m_column_name())} = {user_id}"
    )
    if connection.vendor == "postgresql":
        return f"ARRAY({both})"
    return f"(SELECT json_group_array(name) FROM ({both}))"


def token_revoke(*, token_id: int) -> bool:
    """Revoke a token; False when it was already revoked. The row stays, for the record."""
    return bool(ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(revoked_at=timezone.now()))

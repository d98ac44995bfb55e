"""Bearer-token authentication and the two roles of the API.

Viewers read (runs.view_run), operators change state (runs.operate); a superuser is both, and an operator can
also read. No token or a bad one: 401. A good token without the role: 403.
"""

import logging
from collections.abc import Callable
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import HttpBearer

from pal import rows
from pal.db_threads import in_db_thread

from .lockouts import TOKEN_PREFIX
from .permissions import ROLE_PERMISSIONS, has_role
from .services import token_authenticate, token_authenticate_with

log = logging.getLogger("pal.tokens")


class TokensThrottled(Exception):
    """Too many bad tokens from this address lately: 429 with Retry-After (pal.api)."""

    def __init__(self, retry_after: int):
        super().__init__(
            f"too many calls with a bad token from this address: refused for {retry_after} s "
            "(a good token is not affected)"
        )
        self.retry_after = retry_after


def token_refused(request) -> None:
    """A call with a bad token: counted per address with the failed logins (django-axes), so guessing is
    refused (TokensThrottled) once the address has failed PAL_LOGIN_FAILURE_LIMIT times; a good token never
    passes through here, so it costs the calls that authenticate nothing."""
    if request is None or not getattr(settings, "AXES_ENABLED", True):
        return
    credentials = {"username": TOKEN_PREFIX + (request.META.get("REMOTE_ADDR") or "unknown")}
    user_login_failed.send(sender=__name__, credentials=credentials, request=request)
    if AxesProxyHandler.is_locked(request, credentials):
        log.warning("API: too many bad tokens from %s: refused for now", request.META.get("REMOTE_ADDR"))
        raise TokensThrottled(int(settings.AXES_COOLOFF_TIME.total_seconds()))


class TokenAuth(HttpBearer):
    def __init__(self, *, role: str):
        super().__init__()
        self.role = role
        self.permissions = ROLE_PERMISSIONS[role]  # the names the pages check too (tokens.permissions)

    def authenticate(self, request, token):
        return self.check(token, request)

    def check(self, token, request=None):
        return self.checked(token_authenticate(token), request)

    def checked(self, user, request=None):
        """The user behind the token (None: it was refused), if they have the role; else the API's 401 or 403."""
        if user is None:
            token_refused(request)
            raise AuthenticationError(
                message="the token is not valid (unknown, revoked, expired, or its user is inactive)"
            )
        if not has_role(user, self.role):
            raise AuthorizationError(
                message=f"user {user.get_username()!r} does not have the {self.role} role: this call needs the "
                f"permission {' or '.join(self.permissions)}"
            )
        return user


class TokenAuthWith(TokenAuth):
    """The role's check, with the call's own row read in the same statement as the token (one round trip instead
    of two): read_of(request) gives (rows.Read, params), or None to read the token alone. What the read found is
    left on the request as auth_read (None: no row), for the view; a refused call is refused as by TokenAuth."""

    def __init__(self, *, role: str, read_of: Callable[[Any], tuple[rows.Read, list] | None]):
        super().__init__(role=role)
        self.read_of = read_of

    def authenticate(self, request, token):
        wanted = self.read_of(request)
        if wanted is None:
            return self.check(token, request)
        user, found = token_authenticate_with(token, *wanted)
        request.auth_read = found
        return self.checked(user, request)


class AsyncTokenAuth(TokenAuth):
    """The same check for async views (the event stream), run on the stream's shared database threads so an
    open stream keeps no database connection of its own."""

    async def authenticate(self, request, token):
        return await in_db_thread(self.check, token, request)


viewer = TokenAuth(role="viewer")
operator = TokenAuth(role="operator")
viewer_async = AsyncTokenAuth(role="viewer")

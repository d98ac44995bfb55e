"""Bearer-token authentication and the two roles of the API.

Viewers read (runs.view_run), operators change state (runs.operate); a superuser is both, and an operator can
also read. No token or a bad one: 401. A good token without the role: 403.
"""

from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import HttpBearer

from pal.db_threads import in_db_thread

from .permissions import ROLE_PERMISSIONS, has_role
from .services import token_authenticate


class TokenAuth(HttpBearer):
    def __init__(self, *, role: str):
        super().__init__()
        self.role = role
        self.permissions = ROLE_PERMISSIONS[role]  # the names the pages check too (tokens.permissions)

    def authenticate(self, request, token):
        return self.check(token)

    def check(self, token):
        user = token_authenticate(token)
        if user is None:
            raise AuthenticationError(message="the token is not valid (unknown, revoked, or its user is inactive)")
        if not has_role(user, self.role):
            raise AuthorizationError(
                message=f"user {user.get_username()!r} does not have the {self.role} role: this call needs the "
                f"permission {' or '.join(self.permissions)}"
            )
        return user


class AsyncTokenAuth(TokenAuth):
    """The same check for async views (the event stream), run on the stream's shared database threads so an
    open stream keeps no database connection of its own."""

    async def authenticate(self, request, token):
        return await in_db_thread(self.check, token)


viewer = TokenAuth(role="viewer")
operator = TokenAuth(role="operator")
viewer_async = AsyncTokenAuth(role="viewer")

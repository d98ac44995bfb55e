"""Bearer-token authentication and the two roles of the API.

Viewers read (runs.view_run), operators change state (runs.operate); a superuser is both, and an operator can
also read. No token or a bad one: 401. A good token without the role: 403.
"""

from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import HttpBearer

from .services import token_authenticate

VIEW = "runs.view_run"
OPERATE = "runs.operate"


class TokenAuth(HttpBearer):
    def __init__(self, *permissions: str, role: str):
        super().__init__()
        self.permissions = permissions
        self.role = role

    def authenticate(self, request, token):
        return self.check(token)

    def check(self, token):
        user = token_authenticate(token)
        if user is None:
            raise AuthenticationError(message="the token is not valid (unknown, revoked, or its user is inactive)")
        if not any(user.has_perm(p) for p in self.permissions):
            raise AuthorizationError(
                message=f"user {user.get_username()!r} does not have the {self.role} role: this call needs the "
                f"permission {' or '.join(self.permissions)}"
            )
        return user


class AsyncTokenAuth(TokenAuth):
    """The same check for async views (the event stream), run on the stream's shared database threads so an
    open stream keeps no database connection of its own."""

    async def authenticate(self, request, token):
        from runs.streams import in_db_thread

        return await in_db_thread(self.check, token)


viewer = TokenAuth(VIEW, OPERATE, role="viewer")
operator = TokenAuth(OPERATE, role="operator")
viewer_async = AsyncTokenAuth(VIEW, OPERATE, role="viewer")

"""Who may see and act on the operator's pages: the login, permission and method checks the views wear.

Reading needs runs.view_run (or runs.operate); every action needs runs.operate, a POST and a CSRF token
(CsrfViewMiddleware checks it before the view). The permission names are tokens.permissions', the same ones the
API's bearer tokens are checked against.
"""

from functools import wraps
from typing import Literal
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from tokens.permissions import OPERATE, VIEW_RUN, has_role


def can_read(user) -> bool:
    return user.is_active and has_role(user, "viewer")


def can_operate(user) -> bool:
    return user.is_active and has_role(user, "operator")


def stream_access(user) -> Literal["ok", "login", "forbidden"]:
    """The event stream's check (an async view cannot wear reader): 'ok', 'login' or 'forbidden'. Reads the
    session and permissions, so the stream calls it on its database threads."""
    if not user.is_authenticated:
        return "login"
    return "ok" if can_read(user) else "forbidden"


def to_login(request):
    """To the login page, and back here after it."""
    if request.htmx:  # a poll after the session ended: send the whole window to the login page, not a fragment
        back = request.htmx.current_url_abs_path or request.get_full_path()
        return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': back})}")
    return redirect_to_login(request.get_full_path())


def reader(view):
    """Login, then runs.view_run or runs.operate: else 403."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return to_login(request)
        if not can_read(request.user):
            raise PermissionDenied(f"reading runs needs the permission {VIEW_RUN} (or {OPERATE})")
        return view(request, *args, **kwargs)

    return wrapped


def operator(view):
    """POST only, login, then runs.operate: else 403. CsrfViewMiddleware has checked the token already."""

    @wraps(view)
    @require_POST
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return to_login(request)
        if not can_operate(request.user):
            raise PermissionDenied(f"this action needs the operator permission ({OPERATE})")
        return view(request, *args, **kwargs)

    wrapped.pal_operator = True  # type: ignore[attr-defined]  # tests find every action by it
    return wrapped

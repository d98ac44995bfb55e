"""Site-wide answers of the pages: refusals that an htmx request can show as a line of text."""

from django.http import HttpResponseForbidden
from django.shortcuts import render
from django.views import defaults

from pal import db_away


def _wants_text(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def permission_denied(request, exception=None):
    """403: for htmx a plain line (the page shows it in its flash bar), else the page."""
    detail = str(exception or "") or "you do not have the permission to do this"
    if _wants_text(request):
        return HttpResponseForbidden(f"Refused: {detail}", content_type="text/plain; charset=utf-8")
    return render(request, "403.html", {"detail": detail}, status=403)


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: an action posted without a valid CSRF token."""
    detail = f"the CSRF check failed ({reason}); reload the page and try again"
    if _wants_text(request):
        return HttpResponseForbidden(f"Refused: {detail}", content_type="text/plain; charset=utf-8")
    return render(request, "403.html", {"detail": detail}, status=403)


def server_error(request):
    """500, or 503 when the error is the database's going away (pal.db_away): a page that reads nothing from it."""
    return db_away.unavailable_after_error(request) or defaults.server_error(request)

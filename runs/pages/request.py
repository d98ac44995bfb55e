"""What the page views read from a request: who acts, the htmx target, the run, where to go back, the reason."""

from django.http import Http404
from django.utils.http import url_has_allowed_host_and_scheme

from .. import services


def _by(request) -> str:
    return request.user.get_username()


def _target(request) -> str | None:
    return request.htmx.target if request.htmx else None


def _run_or_404(run_id):
    try:
        return services.run_get(run_id=run_id)
    except services.NotFound as exc:
        raise Http404(exc.detail) from None


def _back(request, default: str) -> str:
    """Where a form without JavaScript goes after acting: its `next` field when it is ours, else default."""
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def _reason(request) -> str:
    return request.POST.get("reason", "").strip()

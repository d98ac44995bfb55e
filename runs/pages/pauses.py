"""The pause forms of the run page, the workflow page and /ops/ (POST /pauses/, POST /pauses/{id}/resume/): the
same services as the API's /pauses calls, so a page's pause is recorded with who and why like an API call."""

# Each form posts here and comes back to the page it was on (`next`, a path of this site only) with a message: a
# refusal (a blank reason, a second pause of a target, a bad per_second) is the service's own words, never a 500.

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from .. import services
from .access import operator


def _back(request) -> HttpResponseRedirect:
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=False):
        back = reverse("runs:ops")
    return HttpResponseRedirect(back)


def _by(request) -> str:
    return request.user.get_username()


@operator
def pause_new(request):
    """Pause a run, a workflow, a dependency or the fleet (scope, target, reason)."""
    post = request.POST
    try:
        pause = services.pause_create(
            scope=post.get("scope", ""), target=post.get("target", ""), by=_by(request), reason=post.get("reason", "")
        )
    except services.ServiceError as exc:
        messages.error(request, f"Not paused: {exc.detail}")
    else:
        messages.success(request, f"Paused {pause.scope} {pause.target}: what it holds parks at its next step")
    return _back(request)


@operator
def pause_resume(request, pause_id):
    """Resume a pause (reason, per_second when paced)."""
    text = request.POST.get("per_second", "").strip()
    try:
        per_second = float(text) if text else None
    except ValueError:
        messages.error(request, f"Not resumed: per_second is a number of runs a second, not {text!r}")
        return _back(request)
    try:
        pause, released = services.pause_resume(
            pause_id=pause_id, by=_by(request), reason=request.POST.get("reason", ""), per_second=per_second
        )
    except services.ServiceError as exc:
        messages.error(request, f"Not resumed: {exc.detail}")
    else:
        pace = f", {per_second:g} a second" if per_second else ""
        messages.success(request, f"Resumed {pause.scope} {pause.target}: {released} held run(s) released{pace}")
    return _back(request)

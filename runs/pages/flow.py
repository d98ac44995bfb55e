"""The operator's side of flow control on the pages: raising a run's budget (a run waiting on it goes on)."""

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from .. import services
from .access import operator


def _number(raw: str, cast):
    raw = (raw or "").strip()
    return cast(raw) if raw else None


@require_POST
@operator
def run_budget(request, run_id):
    """POST max_cost_usd and/or max_tokens with a reason: the new caps, journaled budget_raised with who and why."""
    try:
        run = services.run_get(run_id=run_id)
    except services.NotFound as exc:
        raise Http404(exc.detail) from None
    back = request.POST.get("next") or reverse("runs:detail", args=[run.id])
    if not back.startswith("/"):
        back = reverse("runs:detail", args=[run.id])
    try:
        max_cost = _number(request.POST.get("max_cost_usd", ""), float)
        max_tokens = _number(request.POST.get("max_tokens", ""), int)
    except ValueError:
        messages.error(request, "max_cost_usd must be a number and max_tokens a whole number")
        return HttpResponseRedirect(back)
    who = request.user.get_username()
    try:
        services.run_budget_raise(
            run_id=run.id,
            by=who,
            reason=request.POST.get("reason", "").strip(),
            max_cost_usd=max_cost,
            max_tokens=max_tokens,
        )
    except services.ServiceError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"Budget of run {run.id} changed by {who}")
    return HttpResponseRedirect(back)

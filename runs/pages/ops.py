"""The ops dashboard (/ops/): counts, sweeps, stuck runs, open side effects and approvals, budgets, rate limits."""

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from pal.clock import db_now
from tokens.lockouts import lockouts_active

from .. import explain, selectors, services
from ..models import SideEffect
from ..rate_limits import rate_use
from .access import can_operate, operator, reader
from .formatting import delta_text
from .request import _by, _reason, _target

# --- the ops dashboard ----------------------------------------------------------------------------


def _ops_counts_context(now) -> dict:
    sweeps = selectors.sweeps_recent(limit=5)
    last = next((s for s in sweeps if s.finished_at), None)
    return {
        "counts": selectors.status_counts(),
        "sweeps": sweeps,
        "last_sweep": last,
        "last_redrive": selectors.sweep_last_redrive(),
        "sweep_age": delta_text(now - last.finished_at) if last else "",
        "sweep_late": bool(last and (now - last.finished_at).total_seconds() > 3 * settings.PAL_RECOVERY_INTERVAL),
        "recovery_interval": settings.PAL_RECOVERY_INTERVAL,
    }


@require_GET
@reader
def ops(request):
    """The dashboard. Its counts and its stuck runs refresh themselves (they hold no form); the side effects and
    approvals, where an operator types a reason, change only when someone acts."""
    now = db_now()  # leases, timers and rate windows are by the database's clock (pal.clock)
    target = _target(request)
    if target == "ops-counts":
        return render(request, "runs/ops.html#counts", _ops_counts_context(now))
    if target == "stuck":
        return render(request, "runs/ops.html#stuck", {"stuck": explain.stuck_runs_grouped(now=now)})
    if target == "decision-counts":
        return render(
            request, "runs/ops.html#decision_counts", {"decisions": selectors.decisions_count(user=request.user)}
        )
    context = {
        **_ops_counts_context(now),
        "stuck": explain.stuck_runs_grouped(now=now),
        "effects": selectors.side_effects_open(),
        "approvals": selectors.approvals_pending(),
        "decisions": selectors.decisions_count(user=request.user),
        "budgets": [{"run": run, "why": explain.run_why(run, now=now)} for run in selectors.budgets_pending()],
        "rate_limits": rate_use(now=now),
        "lockouts": lockouts_active(now=now),
        "pauses": [
            {"pause": p, "held": services.pause_held_count(pause_id=p.id)} for p in services.pause_list(active=True)
        ],
        "can_operate": can_operate(request.user),
    }
    return render(request, "runs/ops.html", context)


@operator
def side_effect_decide(request, effect_id: int):
    effect = SideEffect.objects.select_related("run", "run__workflow").filter(id=effect_id).first()
    if effect is None:
        raise Http404(f"side effect {effect_id} does not exist")
    decision = request.POST.get("decision", "")
    try:
        effect = services.side_effect_resolve(
            key=effect.key, decision=decision, by=_by(request), reason=_reason(request)
        )
        notice = {
            "level": "ok",
            "text": {
                "mark_delivered": f"Marked delivered by {_by(request)}.",
                "send_again": f"Sent again by {_by(request)}: now {effect.status}."
                if effect.status != "claimed"
                else f"Run re-driven by {_by(request)}: its deliver step sends it again with the same key.",
            }[decision],
        }
        status = 200
    except services.ServiceError as exc:
        effect.refresh_from_db()
        notice, status = {"level": "error", "text": exc.detail}, exc.status
    if not request.htmx:
        (messages.success if status == 200 else messages.error)(request, notice["text"])
        return HttpResponseRedirect(reverse("runs:ops") + "#side-effects")
    row = {"effect": effect, "run": effect.run, "in_flight": False}
    return render(
        request, "runs/ops.html#side_effect_row", {"item": row, "notice": notice, "can_operate": True}, status=status
    )

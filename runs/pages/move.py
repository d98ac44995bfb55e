"""The move page (README, "The operator's pages"): /runs/<id>/move/ picks another version of the run's workflow and
shows what moving there would do, step by step (a GET, ?version=N, so it works without JavaScript; htmx swaps the
preview alone when the choice changes); a reason and "Move" make the move and go back to the run page."""

# Reads and the move go through runs.services (run_move_preview, run_move) as in the API. The page and its preview
# need a reader; the move an operator and a CSRF token (runs.pages.access). A refusal shows on the page (the move's
# with its status: 400, 404, 409, 422), never a 500.

from django.contrib import messages
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from .. import selectors, services
from ..audit import Audit
from ..code import is_code
from ..models import Run
from .access import can_operate, operator, reader
from .request import _by, _reason, _run_or_404, _target


def _version(text: str | None) -> int | None:
    try:
        version = int((text or "").strip())
    except ValueError:
        return None
    return version if version >= 1 else None


def _page(request, run: Run, *, version: int | None, reason: str = "", error: str = "", status: int = 200):
    """The page, or its preview alone for htmx; the preview (or why there is none) of the chosen version."""
    preview, problem = None, ""
    if version is not None:
        try:
            preview = services.run_move_preview(run_id=run.id, version=version)
        except services.ServiceError as exc:
            problem = f"{exc.detail} ({exc.code})"
    context = {
        "run": run,
        "versions": [w for w in selectors.workflow_versions(name=run.workflow.name) if w.pk != run.workflow_id],
        "version": version,
        "preview": preview,
        "problem": problem,
        "reason": reason,
        "error": error,
        "can_operate": can_operate(request.user),
        "python": is_code(run.workflow.definition),
    }
    if _target(request) == "move-preview":
        return render(request, "runs/move.html#preview", context)
    return render(request, "runs/move.html", context, status=status)


@reader
def move(request, run_id):
    """GET: the versions to choose from and, with ?version=N, what a move there would do. POST: move_post."""
    if request.method == "POST":
        return move_post(request, run_id)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    return _page(request, _run_or_404(run_id), version=_version(request.GET.get("version")))


@operator
def move_post(request, run_id):
    """Make the move previewed (version, reason), then the run page with a message; a refusal: the page again."""
    run = _run_or_404(run_id)
    version, reason = _version(request.POST.get("version")), _reason(request)
    if version is None:
        return _page(request, run, version=None, reason=reason, error="choose the version to move to", status=422)
    try:
        audit = Audit.of(by=_by(request), reason=reason, action="a move")
        services.run_move(run_id=run.id, version=version, audit=audit)
    except services.ServiceError as exc:
        error = f"{exc.detail} ({exc.code})"
        return _page(request, run, version=version, reason=reason, error=error, status=exc.status)
    messages.success(request, f"Moved run {run.id} to {run.workflow.name} v{version}: {reason}")
    return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))

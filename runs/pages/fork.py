"""The fork page (docs/reference/pages.md): /runs/<id>/fork/ chooses the step to fork from,
optionally a new input (JSON, checked here before it goes) and a reason; "Preview" shows what the fork would
reuse (and from which journal row) and what it would run anew; "Fork" makes the new run and opens its page."""

# Reads and the fork itself go through runs.services (run_fork_preview, run_fork) as in the API. The page needs a
# reader; the preview and the fork an operator and a CSRF token (runs.pages.access). A refusal answers the page again
# with 422 and the error by field, never a 500.

import json

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from .. import services
from ..models import Run
from .access import can_operate, operator, reader
from .forms import JsonObjectField


class ForkForm(forms.Form):
    """What POST /runs/{id}/fork takes: the step, the input as JSON text (blank: the original's) and a reason."""

    from_step = forms.ChoiceField(label="Fork from step")
    input = JsonObjectField(rows=8, empty=None)
    reason = forms.CharField(max_length=2000, required=False)

    def __init__(self, *args, run: Run, **kwargs):
        super().__init__(*args, **kwargs)
        steps = run.workflow.definition.get("steps", [])
        from_step = self.fields["from_step"]
        assert isinstance(from_step, forms.ChoiceField)
        from_step.choices = [(s["id"], f"{s['id']} ({s.get('kind')})") for s in steps]


def _run_or_404(run_id) -> Run:
    try:
        return services.run_get(run_id=run_id)
    except services.NotFound as exc:
        raise Http404(exc.detail) from None


def _page(request, run: Run, form: ForkForm, *, preview=None, status: int = 200):
    context = {"run": run, "form": form, "preview": preview, "can_operate": can_operate(request.user)}
    return render(request, "runs/fork.html", context, status=status)


@reader
def fork(request, run_id):
    """GET: the form (the last step chosen, or ?from_step=, and the original's input). POST: fork_post."""
    if request.method == "POST":
        return fork_post(request, run_id)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    run = _run_or_404(run_id)
    steps = run.workflow.definition.get("steps", [])
    chosen = request.GET.get("from_step") or (steps[-1]["id"] if steps else "")
    form = ForkForm(run=run, initial={"from_step": chosen, "input": json.dumps(run.input, indent=2)})
    return _page(request, run, form)


@operator
def fork_post(request, run_id):
    """action "preview" (the default): the plan, with the form kept as typed; "fork": the new run, then its page."""
    run = _run_or_404(run_id)
    form = ForkForm(request.POST, run=run)
    if not form.is_valid():
        return _page(request, run, form, status=422)
    data = form.cleaned_data
    reason = data["reason"].strip()
    # A fork of another step than the one previewed (the choice changed since): preview that one first.
    previewed = request.POST.get("previewed", "")
    forking = request.POST.get("action") == "fork" and previewed in ("", data["from_step"])
    if forking and not reason:
        form.add_error("reason", "a fork needs a reason (journaled with your name on both runs)")
        return _page(request, run, form, status=422)
    try:
        if not forking:
            preview = services.run_fork_preview(run_id=run.id, from_step=data["from_step"], input=data["input"])
            return _page(request, run, form, preview=preview)
        new = services.run_fork(
            run_id=run.id,
            from_step=data["from_step"],
            input=data["input"],
            reason=reason,
            by=request.user.get_username(),
        )
    except services.ServiceError as exc:
        form.add_error(None, f"{exc.detail} ({exc.code})")
        return _page(request, run, form, status=422)
    messages.success(request, f"Forked from run {run.id} at step {data['from_step']}: {reason}")
    return HttpResponseRedirect(reverse("runs:detail", args=[new.id]))

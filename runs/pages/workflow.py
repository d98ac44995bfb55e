"""The workflow pages (docs/reference/pages.md): /workflows/ (every workflow, its latest version and the last 24 hours'
numbers) and /workflows/<name>/ (its graph, its versions and a diff between two, charts over time, its newest
runs and a form that starts a run)."""

# Reads go through runs.workflow_stats and runs.selectors, the start through runs.services.run_create as in the
# API; runs.pages.charts draws the pictures. Reading needs a reader, starting an operator and a CSRF token
# (runs.pages.access). A refused start answers the page again with 422 and the errors by field, never a 500.

import json

from django import forms
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from .. import selectors, services, workflow_stats
from ..code import is_code, steps_taken
from ..models import Pause, PauseScope, RunStatus, Workflow
from . import charts
from .access import can_operate, operator, reader
from .formatting import duration_text, usd
from .forms import JsonObjectField

HOURS, DAYS = 24, 14  # what the charts span
RECENT_RUNS = 10


class StartForm(forms.Form):
    """The start form: the version, the input as JSON text (checked here, before it goes) and an optional
    idempotency key, as POST /runs takes them."""

    version = forms.TypedChoiceField(coerce=int, label="Version")
    input = JsonObjectField(rows=8, empty={})
    idempotency_key = forms.CharField(max_length=255, required=False, label="Idempotency key (optional)")

    def __init__(self, *args, versions: list[Workflow], **kwargs):
        super().__init__(*args, **kwargs)
        version = self.fields["version"]
        assert isinstance(version, forms.TypedChoiceField)
        version.choices = [(w.version, f"v{w.version}") for w in versions]


def _versions_or_404(name: str) -> list[Workflow]:
    versions = list(selectors.workflow_versions(name=name))
    if not versions:
        raise Http404(f"workflow {name!r} does not exist")
    return versions


@require_GET
@reader
def workflow_list(request):
    return render(
        request,
        "runs/workflows.html",
        {
            "summaries": workflow_stats.workflow_summaries(),
            "hours": HOURS,
        },
    )


@require_GET
@reader
def workflow_detail(request, name: str):
    versions = _versions_or_404(name)
    latest = versions[0]
    recent = selectors.run_list(workflow=name, limit=RECENT_RUNS)[0]
    form = StartForm(
        versions=versions,
        initial={"version": latest.version, "input": json.dumps(recent[0].input if recent else {}, indent=2)},
    )
    return render(request, "runs/workflow.html", _detail_context(request, versions, form=form, recent=recent))


@operator
def workflow_start(request, name: str):
    versions = _versions_or_404(name)
    form = StartForm(request.POST, versions=versions)
    if form.is_valid():
        try:
            run, _ = services.run_create(
                workflow_name=name,
                version=form.cleaned_data["version"],
                input=form.cleaned_data["input"],
                idempotency_key=form.cleaned_data["idempotency_key"] or None,
                created_by=request.user.get_username(),
            )
        except services.ServiceError as exc:  # the version went away, the key was used with another input
            form.add_error(None, f"{exc.detail} ({exc.code})")
        else:
            return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))
    recent = selectors.run_list(workflow=name, limit=RECENT_RUNS)[0]
    context = _detail_context(request, versions, form=form, recent=recent)
    return render(request, "runs/workflow.html", context, status=422)


def _diff_pair(params, versions: list[Workflow]) -> tuple[Workflow, Workflow, list[str]]:
    """The two versions to compare (a older, b newer by default: the latest and the one before), from ?a=&b=."""
    by_number = {w.version: w for w in versions}
    problems = []
    chosen = []
    for key, default in (("a", versions[min(1, len(versions) - 1)]), ("b", versions[0])):
        raw = params.get(key)
        try:
            chosen.append(by_number[int(raw)] if raw else default)
        except (ValueError, KeyError):
            problems.append(f"version {raw!r} ({key}) does not exist; showing v{default.version}")
            chosen.append(default)
    return chosen[0], chosen[1], problems


def _charts(name: str) -> dict:
    now = timezone.now()
    hourly = workflow_stats.runs_by_status_per_hour(name=name, now=now, hours=HOURS)
    durations = workflow_stats.durations_per_hour(name=name, now=now, hours=HOURS)
    daily = workflow_stats.cost_per_day(name=name, now=now, days=DAYS)
    hour_labels = [b["start"].strftime("%H:00") for b in hourly]
    day_labels = [d["start"].strftime("%m-%d") for d in daily]
    return {
        "runs_chart": charts.stacked_bars_svg(
            hour_labels,
            [b["counts"] for b in hourly],
            series=RunStatus.values,
            title=f"Runs by status per hour, the last {HOURS} hours (UTC)",
            every=3,
        ),
        "durations_chart": charts.lines_svg(
            [b["start"].strftime("%H:00") for b in durations],
            {"p50": [b["p50_s"] for b in durations], "p95": [b["p95_s"] for b in durations]},
            title=f"Duration of the runs that ended, p50 and p95 per hour, the last {HOURS} hours (UTC)",
            colours={"p50": "#1d4ed8", "p95": "#b45309"},
            fmt=duration_text,
            every=3,
        ),
        "cost_chart": charts.bars_svg(
            day_labels,
            [d["cost_usd"] for d in daily],
            title=f"Cost per day of the runs created that day, the last {DAYS} days (UTC)",
            fmt=usd,
            every=2,
        ),
        "daily": daily,
    }


def _steps_shown(latest: Workflow, recent) -> list[dict]:
    """A JSON workflow's steps; a Python workflow's are the ones its newest runs called, drawn together."""
    if not is_code(latest.definition):
        return latest.definition.get("steps", [])
    return steps_taken([run.id for run in recent])


def _detail_context(request, versions: list[Workflow], *, form: StartForm, recent) -> dict:
    latest = versions[0]
    older, newer, problems = _diff_pair(request.GET, versions)
    summary = workflow_stats.workflow_summaries(names=[latest.name])[0]
    return {
        "workflow": latest,
        "versions": versions,
        "summary": summary,
        "graph": charts.graph_svg(_steps_shown(latest, recent)),
        "code": latest.definition.get("code"),
        "definition": json.dumps(latest.definition, indent=2, ensure_ascii=False),
        "diff_a": older,
        "diff_b": newer,
        "diff": workflow_stats.definition_diff(older, newer),
        "problems": problems,
        "recent": recent,
        "form": form,
        "can_operate": can_operate(request.user),
        "pause": Pause.objects.filter(scope=PauseScope.WORKFLOW, target=latest.name, resumed_at__isnull=True).first(),
        "hours": HOURS,
        **_charts(latest.name),
    }

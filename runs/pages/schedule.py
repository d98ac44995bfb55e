"""The schedules page (docs/reference/pages.md): /schedules/ lists every schedule with its next fire time (UTC and its
own zone) and the last runs it made, and lets an operator create one, pause, resume or delete it, with a reason."""

# Everything goes through runs.schedules as in the API, so a page action is recorded with who and why like an API
# call. Reading needs a reader; every action an operator, a POST and a CSRF token (runs.pages.access). A refused create
# answers the page again with 422 and the error by field, never a 500.

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from .. import schedules
from ..models import ScheduleCatchup
from .access import can_operate, operator, reader
from .forms import JsonObjectField

RECENT_RUNS = 5


class ScheduleForm(forms.Form):
    """What POST /schedules takes, with the input as JSON text."""

    workflow = forms.CharField(max_length=64)
    cron = forms.CharField(max_length=120, help_text='5 fields, e.g. "0 9 * * 1-5"')
    timezone = forms.CharField(max_length=64, initial="UTC", help_text="IANA, e.g. Europe/Berlin")
    input = JsonObjectField(rows=3, empty={})
    catchup = forms.ChoiceField(choices=ScheduleCatchup.choices, initial=ScheduleCatchup.ONE)
    reason = forms.CharField(max_length=2000, required=False)


def _rows() -> list[dict]:
    items = schedules.schedule_list()
    recent = schedules.schedule_recent_runs(schedule_ids=[s.id for s in items], limit=RECENT_RUNS)
    return [{"schedule": s, "recent": recent[s.id]} for s in items]


def _page(request, form: ScheduleForm, *, status: int = 200):
    context = {"rows": _rows(), "form": form, "can_operate": can_operate(request.user)}
    return render(request, "runs/schedules.html", context, status=status)


@reader
def schedule_list(request):
    """GET: the list and the create form. POST: schedule_create."""
    if request.method == "POST":
        return schedule_create(request)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    return _page(request, ScheduleForm())


@operator
def schedule_create(request):
    form = ScheduleForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            schedule = schedules.schedule_create(
                workflow=data["workflow"],
                cron=data["cron"],
                timezone_name=data["timezone"],
                input=data["input"],
                catchup=data["catchup"],
                by=request.user.get_username(),
                reason=data["reason"],
            )
        except schedules.ScheduleInvalid as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.detail.removeprefix(f"{exc.field}: "))
        else:
            first = f"{schedule.next_fire_at:%Y-%m-%d %H:%M} UTC" if schedule.next_fire_at else "none"
            messages.success(request, f"Schedule created: {schedule}; first fire {first}")
            return HttpResponseRedirect(reverse("runs:schedules"))
    return _page(request, form, status=422)


ACTIONS = {"pause": schedules.schedule_pause, "resume": schedules.schedule_resume, "delete": schedules.schedule_delete}


@operator
def schedule_action(request, schedule_id, action: str):
    """pause, resume or delete one schedule, with the reason typed beside the button."""
    act = ACTIONS.get(action)
    if act is None:
        raise Http404(f"no action {action!r} on a schedule")
    try:
        act(schedule_id=schedule_id, by=request.user.get_username(), reason=request.POST.get("reason", "").strip())
    except schedules.NotFound as exc:
        raise Http404(exc.detail) from None
    messages.success(request, f"Schedule {str(schedule_id)[:8]}: {action} done")
    return HttpResponseRedirect(reverse("runs:schedules"))

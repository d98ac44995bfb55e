"""Admin: raw records. Actions call the same services as the API and journal who did it;
the journal is read-only here, shown on its run's page."""

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from journal.selectors import events_for_run
from journal.services import dumps
from pal.clock import db_now
from tokens.permissions import has_role

from . import schedules, services
from .budgets import caps_of
from .models import Pause, Rerun, Run, RunLock, SavedView, Schedule, ScheduleEvent, SideEffect, Sweep, Workflow


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "description", "created_at")
    list_filter = ("name",)
    search_fields = ("name",)
    readonly_fields = ("name", "version", "definition", "created_at")

    def has_change_permission(self, request, obj=None):
        return False  # a version is immutable; post a new one


class SideEffectInline(admin.TabularInline):
    model = SideEffect
    extra = 0
    can_delete = False
    fields = ("key", "channel", "target", "status", "claimed_at", "delivered_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


def _reason_action(name: str, label: str, verb: str, apply, noun: str = ""):
    """An admin action that asks for a reason on an intermediate page, then calls a service per run (or per
    `noun`: a pause)."""

    def action(modeladmin, request, queryset):
        reason = request.POST.get("reason", "").strip()
        if "confirm" not in request.POST or not reason:
            return TemplateResponse(
                request,
                "admin/runs/reason.html",
                {
                    **modeladmin.admin_site.each_context(request),
                    "title": f"{label}: give a reason",
                    "runs": queryset,
                    "action": request.POST.get("action"),
                    "verb": verb,
                    "missing": "confirm" in request.POST and not reason,
                    "opts": modeladmin.model._meta,
                    "noun": noun,
                },
            )
        done, refused = 0, []
        for run in queryset:
            try:
                apply(run=run, by=request.user.get_username(), reason=reason, force="force" in request.POST)
                done += 1
            except services.ServiceError as exc:
                refused.append(f"{run.id}: {exc.detail}")
        if done:
            modeladmin.message_user(request, f"{verb}: {done} {noun or 'run'}(s).", messages.SUCCESS)
        for line in refused:
            modeladmin.message_user(request, line, messages.WARNING)
        return None

    action.__name__ = name
    return admin.action(description=label, permissions=["operate"])(action)


redrive_action = _reason_action(
    "redrive_runs",
    "Re-drive selected runs",
    "Re-driven",
    lambda run, by, reason, force: services.run_redrive(run_id=run.id, by=by, reason=reason, force=force),
)
cancel_action = _reason_action(
    "cancel_runs",
    "Cancel selected runs",
    "Cancelled",
    lambda run, by, reason, force: services.run_cancel(run_id=run.id, by=by, reason=reason),
)


def _budget_doubled(*, run, by, reason, force):
    """Twice the run's current caps (its workflow's budget, as raised since)."""
    caps = caps_of(run)
    if not caps:
        raise services.Conflict(f"run {run.id}'s workflow {run.workflow.name} has no budget", code="no_budget")
    services.run_budget_raise(run_id=run.id, by=by, reason=reason, **{cap: value * 2 for cap, value in caps.items()})


budget_action = _reason_action("double_budget", "Double the budget of selected runs", "Budget doubled", _budget_doubled)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "workflow", "status", "depth", "lease_holder", "lease_expires", "created_at", "finished_at")
    list_filter = ("status", "workflow__name")
    search_fields = ("id",)
    list_select_related = ("workflow", "lock")
    date_hierarchy = "created_at"
    actions = [redrive_action, cancel_action, budget_action]
    inlines = [SideEffectInline]
    readonly_fields = (
        "id",
        "workflow",
        "status",
        "input",
        "output",
        "error",
        "parent_run",
        "parent_step_id",
        "depth",
        "trigger_meta",
        "idempotency_key",
        "waiting_on",
        "wake_at",
        "created_by",
        "created_at",
        "started_at",
        "finished_at",
        "lease",
        "run_page",
        "journal",
    )
    fieldsets = (
        (None, {"fields": ("id", "run_page", "workflow", "status", "lease", "waiting_on", "wake_at", "error")}),
        ("Data", {"fields": ("input", "output", "trigger_meta", "idempotency_key", "created_by")}),
        ("Tree", {"fields": ("parent_run", "parent_step_id", "depth")}),
        ("Times", {"fields": ("created_at", "started_at", "finished_at")}),
        ("Journal", {"fields": ("journal",)}),
    )

    def has_add_permission(self, request):
        return False  # runs are started through the API or the pages, which validate the input

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the journal outlives nothing it describes

    def has_operate_permission(self, request):
        return has_role(request.user, "operator")  # the pages' and the API's check too

    @admin.display(description="lease holder")
    def lease_holder(self, obj):
        lock = getattr(obj, "lock", None) if hasattr(obj, "lock") else None
        return f"{lock.owner} (epoch {lock.epoch})" if lock else "—"

    @admin.display(description="lease expires")
    def lease_expires(self, obj):
        lock = getattr(obj, "lock", None) if hasattr(obj, "lock") else None
        if not lock:
            return "—"
        left = (lock.expires_at - db_now()).total_seconds()
        return f"{lock.expires_at:%H:%M:%S} ({f'in {left:.0f}s' if left >= 0 else 'expired %.0fs ago' % -left})"

    @admin.display(description="lease")
    def lease(self, obj):
        lock = RunLock.objects.filter(run_id=obj.id).first()
        if not lock:
            return "no lease"
        return f"{lock.owner}, epoch {lock.epoch}, expires {lock.expires_at.isoformat()}"

    @admin.display(description="run page")
    def run_page(self, obj):
        return format_html('<a href="/runs/{}/">open the run page</a>', obj.id)

    @admin.display(description="journal (read-only)")
    def journal(self, obj):
        events = events_for_run(run_id=obj.id, limit=2000)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            (
                (
                    e.seq,
                    e.created_at.strftime("%H:%M:%S.%f")[:-3],
                    e.kind,
                    e.step_id or "",
                    e.attempt or "",
                    dumps(e.payload)[:400],
                )
                for e in events
            ),
        )
        return format_html(
            "<table><thead><tr><th>seq</th><th>at</th><th>kind</th><th>step</th><th>attempt</th><th>payload</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            rows,
        )


@admin.register(RunLock)
class RunLockAdmin(admin.ModelAdmin):
    list_display = ("run", "owner", "epoch", "expires_at", "acquired_at")
    search_fields = ("owner", "run__id")
    readonly_fields = ("run", "owner", "epoch", "expires_at", "acquired_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # dropping a lease is what cancel and forced re-drive do, with a journal entry


@admin.register(SideEffect)
class SideEffectAdmin(admin.ModelAdmin):
    list_display = ("key", "channel", "target", "status", "claimed_at", "delivered_at")
    list_filter = ("status", "channel")
    search_fields = ("key", "target")
    readonly_fields = (
        "key",
        "run",
        "step_id",
        "attempt",
        "channel",
        "target",
        "status",
        "claimed_epoch",
        "response",
        "claimed_at",
        "delivered_at",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = ("started_at", "finished_at", "examined", "redriven_count", "who")
    readonly_fields = ("started_at", "finished_at", "examined", "redriven", "woken", "who")

    @admin.display(description="re-driven")
    def redriven_count(self, obj):
        return len(obj.redriven or [])

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _schedule_action(name: str, label: str, apply):
    """Pause or resume the selected schedules through runs.schedules (recorded with who, and "admin" as why)."""

    def action(modeladmin, request, queryset):
        for schedule in queryset:
            apply(schedule_id=schedule.id, by=request.user.get_username(), reason=f"admin: {label.lower()}")
        modeladmin.message_user(request, f"{label}: {len(queryset)} schedule(s).", messages.SUCCESS)

    action.__name__ = name
    return admin.action(description=f"{label} selected schedules", permissions=["operate"])(action)


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Read, pause, resume and delete; creating and editing go through /schedules/ or the API, which check the
    cron, the timezone and the workflow."""

    list_display = ("workflow_name", "cron", "timezone", "catchup", "enabled", "next_fire_at", "last_fired_at")
    list_filter = ("enabled", "catchup", "workflow_name")
    search_fields = ("workflow_name", "id")
    actions = [
        _schedule_action("pause_schedules", "Pause", schedules.schedule_pause),
        _schedule_action("resume_schedules", "Resume", schedules.schedule_resume),
    ]
    readonly_fields = (
        "id",
        "workflow_name",
        "workflow_version",
        "cron",
        "timezone",
        "input",
        "catchup",
        "enabled",
        "next_fire_at",
        "last_fired_at",
        "created_by",
        "created_at",
        "updated_at",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return has_role(request.user, "operator")

    def has_operate_permission(self, request):
        return has_role(request.user, "operator")

    def delete_model(self, request, obj):
        schedules.schedule_delete(schedule_id=obj.id, by=request.user.get_username(), reason="admin: delete")

    def delete_queryset(self, request, queryset):
        for schedule in queryset:
            self.delete_model(request, schedule)


@admin.register(ScheduleEvent)
class ScheduleEventAdmin(admin.ModelAdmin):
    """What happened to each schedule: read-only, like the journal."""

    list_display = ("created_at", "schedule_id", "kind", "fire_at", "run_id", "by", "reason")
    list_filter = ("kind",)
    search_fields = ("schedule_id", "run_id", "by")
    readonly_fields = ("schedule_id", "kind", "fire_at", "run_id", "by", "reason", "payload", "created_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


resume_action = _reason_action(
    "resume_pauses",
    "Resume selected pauses (their held runs wake now)",
    "Resumed",
    lambda run, by, reason, force: services.pause_resume(pause_id=run.id, by=by, reason=reason),
    noun="pause",
)


@admin.register(Pause)
class PauseAdmin(admin.ModelAdmin):
    """Read the pauses and resume them (with a reason, through runs.services.pause_resume); pausing goes through
    /ops/, the run and workflow pages or POST /pauses, which check the target."""

    list_display = ("scope", "target", "by", "reason", "created_at", "resumed_at", "resumed_by", "per_second")
    list_filter = ("scope", ("resumed_at", admin.EmptyFieldListFilter))
    search_fields = ("target", "by", "reason")
    actions = [resume_action]
    readonly_fields = (
        "id",
        "scope",
        "target",
        "reason",
        "by",
        "created_at",
        "resumed_at",
        "resumed_by",
        "resume_reason",
        "per_second",
        "pace_until",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        return has_role(request.user, "operator")


abort_action = _reason_action(
    "abort_reruns",
    "Abort selected reruns (the runs they have not reached are left as they are)",
    "Aborted",
    lambda run, by, reason, force: services.rerun_abort(rerun_id=run.id, by=by, reason=reason),
    noun="rerun",
)


@admin.register(Rerun)
class RerunAdmin(admin.ModelAdmin):
    """Read the reruns and abort them (with a reason, through runs.services.rerun_abort); starting one goes through
    /reruns/ or POST /reruns, which preview it first."""

    list_display = ("name", "status", "from_step", "done", "count", "refused", "per_second", "by", "created_at")
    list_filter = ("status",)
    search_fields = ("name", "by", "reason")
    actions = [abort_action]
    readonly_fields = (
        "id",
        "name",
        "page",
        "filter",
        "from_step",
        "reason",
        "by",
        "per_second",
        "status",
        "count",
        "done",
        "refused",
        "created_at",
        "finished_at",
        "aborted_by",
        "abort_reason",
    )
    fields = readonly_fields

    @admin.display(description="progress and runs")
    def page(self, obj):
        return format_html('<a href="{}">its page</a>', reverse("runs:rerun", args=[obj.id]))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request):
        return has_role(request.user, "operator")


@admin.register(SavedView)
class SavedViewAdmin(admin.ModelAdmin):
    """Read the saved views; they are made and deleted on /runs/ or through /views (runs.services.views)."""

    list_display = ("name", "owner", "group", "filter", "created_at")
    list_filter = ("group",)
    search_fields = ("name", "owner__username")
    readonly_fields = ("name", "filter", "owner", "group", "created_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

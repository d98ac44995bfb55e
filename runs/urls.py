"""The operator's pages (docs/reference/pages.md), mounted at the site's root by pal.urls."""

from django.urls import path

from .pages import (
    compare,
    flow,
    fork,
    inbox,
    ops,
    pauses,
    reruns,
    run,
    run_list,
    saved_views,
    schedule,
    step,
    workflow,
)

app_name = "runs"

urlpatterns = [
    path("runs/", run_list.run_list, name="list"),
    path("runs/bulk/", run_list.bulk, name="bulk"),
    path("runs/bulk/<int:bulk_id>/", run_list.bulk_progress, name="bulk_progress"),
    path("runs/compare/", compare.run_compare, name="compare"),
    path("runs/views/", saved_views.view_save, name="view_save"),
    path("runs/views/<int:view_id>/delete/", saved_views.view_delete, name="view_delete"),
    path("runs/<uuid:run_id>/", run.run_detail, name="detail"),
    path("runs/<uuid:run_id>/waterfall/", run.run_waterfall, name="waterfall"),
    path("runs/<uuid:run_id>/steps/<str:step_id>/", step.step_panel, name="step"),
    path("runs/<uuid:run_id>/receipt/", run.run_receipt, name="receipt"),
    path("runs/<uuid:run_id>/events/stream", run.run_events_stream, name="events_stream"),
    path("runs/<uuid:run_id>/redrive/", run.run_redrive, name="redrive"),
    path("runs/<uuid:run_id>/cancel/", run.run_cancel, name="cancel"),
    path("runs/<uuid:run_id>/budget/", flow.run_budget, name="budget"),
    path("runs/<uuid:run_id>/retry/", run.run_retry, name="retry"),
    path("runs/<uuid:run_id>/fork/", fork.fork, name="fork"),
    path("runs/<uuid:run_id>/signals/", run.run_signal, name="signal"),
    path("runs/<uuid:run_id>/approvals/<str:step_id>/", run.run_approval, name="approval"),
    path("ops/", ops.ops, name="ops"),
    path("inbox/", inbox.inbox, name="inbox"),
    path("decisions/done/", inbox.decision_done, name="decision_done"),
    path("decisions/<str:token>/", inbox.decision_link, name="decision_link"),
    path("ops/side-effects/<int:effect_id>/", ops.side_effect_decide, name="side_effect"),
    path("pauses/", pauses.pause_new, name="pause_new"),
    path("pauses/<uuid:pause_id>/resume/", pauses.pause_resume, name="pause_resume"),
    path("reruns/", reruns.rerun_list, name="reruns"),
    path("reruns/start/", reruns.rerun_new, name="rerun_new"),
    path("reruns/<uuid:rerun_id>/", reruns.rerun_detail, name="rerun"),
    path("reruns/<uuid:rerun_id>/abort/", reruns.rerun_abort, name="rerun_abort"),
    path("workflows/", workflow.workflow_list, name="workflows"),
    path("workflows/<str:name>/", workflow.workflow_detail, name="workflow"),
    path("workflows/<str:name>/start/", workflow.workflow_start, name="workflow_start"),
    path("schedules/", schedule.schedule_list, name="schedules"),
    path("schedules/<uuid:schedule_id>/<str:action>/", schedule.schedule_action, name="schedule_action"),
]

"""The operator's pages (README, "The operator's pages"), mounted at the site's root by pal.urls."""

from django.urls import path

from . import compare_pages, flow_pages, fork_pages, schedule_pages, step_pages, views, workflow_pages

app_name = "runs"

urlpatterns = [
    path("runs/", views.run_list, name="list"),
    path("runs/bulk/", views.bulk, name="bulk"),
    path("runs/bulk/<int:bulk_id>/", views.bulk_progress, name="bulk_progress"),
    path("runs/compare/", compare_pages.run_compare, name="compare"),
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
    path("runs/<uuid:run_id>/waterfall/", views.run_waterfall, name="waterfall"),
    path("runs/<uuid:run_id>/steps/<str:step_id>/", step_pages.step_panel, name="step"),
    path("runs/<uuid:run_id>/receipt/", views.run_receipt, name="receipt"),
    path("runs/<uuid:run_id>/events/stream", views.run_events_stream, name="events_stream"),
    path("runs/<uuid:run_id>/redrive/", views.run_redrive, name="redrive"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<uuid:run_id>/budget/", flow_pages.run_budget, name="budget"),
    path("runs/<uuid:run_id>/retry/", views.run_retry, name="retry"),
    path("runs/<uuid:run_id>/fork/", fork_pages.fork, name="fork"),
    path("runs/<uuid:run_id>/signals/", views.run_signal, name="signal"),
    path("runs/<uuid:run_id>/approvals/<str:step_id>/", views.run_approval, name="approval"),
    path("ops/", views.ops, name="ops"),
    path("ops/side-effects/<int:effect_id>/", views.side_effect_decide, name="side_effect"),
    path("workflows/", workflow_pages.workflow_list, name="workflows"),
    path("workflows/<str:name>/", workflow_pages.workflow_detail, name="workflow"),
    path("workflows/<str:name>/start/", workflow_pages.workflow_start, name="workflow_start"),
    path("schedules/", schedule_pages.schedule_list, name="schedules"),
    path("schedules/<uuid:schedule_id>/<str:action>/", schedule_pages.schedule_action, name="schedule_action"),
]

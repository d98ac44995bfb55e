"""Celery tasks: thin, ids only, sent after commit by runs.dispatch (by these names). The executor does its own
retries: no autoretry here. This module is the top of the engine's layers: it calls into them, nothing imports it."""

from celery import shared_task

from .recovery import sweep_once
from .schedules import schedule_fire_due
from .services import bulk_apply, rerun_advance, run_wake_timer
from .walk import run_drive, run_item


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.drive")
def drive(run_id: str):
    return run_drive(run_id=run_id, task_id=drive.request.id)


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.item")
def item(run_id: str, sid: str):
    return run_item(run_id=run_id, sid=sid, task_id=item.request.id)


@shared_task(ignore_result=True, name="runs.tasks.sweep")
def sweep(who: str = "beat"):
    sweep_once(who=who)


@shared_task(ignore_result=True, name="runs.tasks.schedules_fire")
def schedules_fire():
    schedule_fire_due(by="beat")


@shared_task(ignore_result=True, name="runs.tasks.wake")
def wake(run_id: str):
    run_wake_timer(run_id=run_id)


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.bulk")
def bulk(bulk_id: int):
    bulk_apply(bulk_id=bulk_id)


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.rerun")
def rerun(rerun_id: str, claim: str):
    rerun_advance(rerun_id=rerun_id, claim=claim)

"""Celery tasks: thin, ids only, sent after commit. The executor does its own retries: no autoretry here."""

import uuid

from celery import shared_task
from django.db import transaction


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.drive")
def drive(run_id: str):
    from .executor import run_drive

    return run_drive(run_id=run_id, task_id=drive.request.id)


@shared_task(ignore_result=True, name="runs.tasks.sweep")
def sweep():
    from .recovery import sweep_once

    sweep_once(who="beat")


@shared_task(ignore_result=True, name="runs.tasks.wake")
def wake(run_id: str):
    from .services import run_wake_timer

    run_wake_timer(run_id=run_id)


def enqueue_wake(*, run_id, countdown: float) -> None:
    """A durable timer's wake-up, after commit. If it is lost, the sweep wakes the run (wake_at is in the database)."""
    transaction.on_commit(lambda: wake.apply_async(args=[str(run_id)], countdown=countdown or None))


@shared_task(acks_late=True, ignore_result=True, name="runs.tasks.bulk")
def bulk(bulk_id: int):
    from .services import bulk_apply

    bulk_apply(bulk_id=bulk_id)


def enqueue_bulk(*, bulk_id: int) -> None:
    transaction.on_commit(lambda: bulk.delay(bulk_id))


def book_drive(*, run_id, force: bool = False):
    """Book the run's lease for a new drive task and send that task once the transaction commits.

    The one way a run is handed to the queue (creation, the sweep, an operator's re-drive or retry, a wake-up).
    Returns the booking's Fence, or None when a live lease holds the run (force steals it). A rollback of the
    surrounding transaction drops both the booking and the send."""
    from . import leases

    task_id = str(uuid.uuid4())
    fence = leases.lease_reserve(run_id=run_id, task_id=task_id, force=force)
    if fence is not None:
        enqueue_drive(run_id=run_id, task_id=task_id)
    return fence


def booked_task_id(fence) -> str:
    return fence.owner.removeprefix("task:")


def enqueue_drive(*, run_id, task_id: str, countdown: float = 0.0) -> None:
    """Send the drive task once the surrounding transaction commits (its lease booking names task_id)."""

    def send():
        drive.apply_async(args=[str(run_id)], task_id=task_id, countdown=countdown or None)

    transaction.on_commit(send)

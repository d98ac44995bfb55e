"""Handing work to the queue: book a run's lease for a new drive task and send that task, send a timer's wake-up
or a bulk action's task. Every send happens once the surrounding transaction commits (a rollback sends nothing).

Tasks are sent by name (runs.tasks registers them under these names), so this module, low in the layers, does
not import the tasks' module, which sits at the top and calls into everything below.
"""

import uuid

from celery import signature
from django.db import transaction

from . import leases

drive = signature("runs.tasks.drive")
wake = signature("runs.tasks.wake")
bulk = signature("runs.tasks.bulk")
sweep = signature("runs.tasks.sweep")
item = signature("runs.tasks.item")


def book_drive(*, run_id, force: bool = False):
    """Book the run's lease for a new drive task and send that task once the transaction commits.

    The one way a run is handed to the queue (creation, the sweep, an operator's re-drive or retry, a wake-up).
    Returns the booking's Fence, or None when a live lease holds the run (force steals it). A rollback of the
    surrounding transaction drops both the booking and the send."""
    task_id = str(uuid.uuid4())
    fence = leases.lease_reserve(run_id=run_id, task_id=task_id, force=force)
    if fence is not None:
        enqueue_drive(run_id=run_id, task_id=task_id)
    return fence


def booked_task_id(fence) -> str:
    return fence.owner.removeprefix("task:")


def enqueue_drive(*, run_id, task_id: str, countdown: float = 0.0) -> None:
    """Send the drive task once the surrounding transaction commits (its lease booking names task_id)."""
    transaction.on_commit(lambda: drive.apply_async(args=[str(run_id)], task_id=task_id, countdown=countdown or None))


def enqueue_item(*, run_id, sid: str, task_id: str) -> None:
    """Send an item of a run's fan-out to the fleet once the walk's commit that booked it is in (runs.branches)."""
    transaction.on_commit(lambda: item.apply_async(args=[str(run_id), sid], task_id=task_id))


def enqueue_wake(*, run_id, countdown: float) -> None:
    """A durable timer's wake-up, after commit. If it is lost, the sweep wakes the run (wake_at is in the database)."""
    transaction.on_commit(lambda: wake.apply_async(args=[str(run_id)], countdown=countdown or None))


def enqueue_bulk(*, bulk_id: int) -> None:
    transaction.on_commit(lambda: bulk.apply_async(args=[bulk_id]))


def enqueue_sweep(*, countdown: float, who: str = "lease-expiry") -> None:
    """A sweep at a lease's expiry, sooner than the beat's next tick (runs.recovery.sweep_at_lease_expiry)."""
    transaction.on_commit(lambda: sweep.apply_async(kwargs={"who": who}, countdown=max(0.0, countdown)))

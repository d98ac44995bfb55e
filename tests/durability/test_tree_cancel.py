"""A cancelled tree stays cancelled (issue 23, section 3). Cancelling a run cancels every run below it in the same
transaction, children first: a lock timeout (or a kill) in the middle leaves all of them live or none. A live child
under a cancelled parent (left by a cancel from before, or rows written by hand) is never driven: the walk that its
wake-up sends, and the sweep that finds it without a lease, end it cancelled, and its webhook is never sent.

Postgres (row locks, lock_timeout, xmin), Redis and a real worker; the receiver counts every request."""

import psycopg
import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from runs import leases
from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.services import approval_decide, run_cancel, run_create, workflow_create
from tests.helpers import QUICK, describe, drive_to_end, events, wait_until, webhook
from tests.support import workers as worker_support

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def parked_tree(kid_steps: list[dict]) -> tuple[Run, Run]:
    """A parent waiting on its child, which waits on an approval (both parked, no lease, no worker)."""
    workflow_create(
        definition={"name": "kid", "steps": [{"id": "ok", "kind": "approval", "prompt": "go?"}, *kid_steps]}
    )
    workflow_create(definition={"name": "mom", "steps": [{"id": "sub", "kind": "child_run", "workflow": "kid"}]})
    parent, _ = run_create(workflow_name="mom", input={})
    drive_to_end(parent)  # in this process: the parent drives its child inline until both park
    child = Run.objects.get(parent_run_id=parent.id)
    assert (parent.status, child.status) == (RunStatus.WAITING, RunStatus.WAITING), describe(child)
    return parent, child


def xmin(run: Run) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM runs WHERE id = %s", [run.id])
        return int(cursor.fetchone()[0])


def test_a_lock_timeout_on_a_child_leaves_the_whole_tree_live_and_then_it_is_cancelled_in_one_transaction():
    parent, child = parked_tree([])
    blocker = psycopg.connect(worker_support.database_url())  # another session holds the child's row
    try:
        blocker.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", [child.id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        with pytest.raises(DatabaseError):
            run_cancel(run_id=parent.id, by="ops", reason="stop the tree")
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    finally:
        blocker.rollback()
        blocker.close()

    # All or nothing: the parent's cancel did not commit without its child's.
    for run in (parent, child):
        run.refresh_from_db()
        assert run.status == RunStatus.WAITING, describe(run)
        assert events(run, "run_cancelled") == [], describe(run)

    run_cancel(run_id=parent.id, by="ops", reason="stop the tree")

    parent.refresh_from_db()
    child.refresh_from_db()
    assert (parent.status, child.status) == (RunStatus.CANCELLED, RunStatus.CANCELLED)
    assert xmin(parent) == xmin(child)  # written by one transaction
    (cancelled,) = events(child, "run_cancelled")
    assert cancelled.payload["why"] == f"parent {parent.id} cancelled: stop the tree"


def _a_live_child_under_a_cancelled_parent(webhook_receiver) -> tuple[Run, Run]:
    """What a cancel that committed the parent and died before its child left (a commit per run, before)."""
    parent, child = parked_tree([webhook("notify", webhook_receiver.url, {"n": 1})])
    leases.lease_drop(run_id=parent.id)
    Run.objects.filter(id=parent.id).update(status=RunStatus.CANCELLED, finished_at=timezone.now(), waiting_on=None)
    return parent, child


def test_a_child_woken_under_a_cancelled_parent_is_not_driven_by_its_walk(celery_workers, webhook_receiver):
    parent, child = _a_live_child_under_a_cancelled_parent(webhook_receiver)
    worker = celery_workers({**webhook_receiver.env(), "PAL_SLICE_SECONDS": "60"}, name="tree-walk", **QUICK)

    approval_decide(run_id=child.id, step_id="ok", approved=True, by="ops")  # sends the child's own walk

    wait_until(
        lambda: Run.objects.filter(id=child.id, status=RunStatus.CANCELLED).exists(),
        timeout=30,
        what="the walk to end the child cancelled",
        explain=lambda: describe(child) + worker.log_tail(40),
    )
    (cancelled,) = events(child, "run_cancelled")
    assert cancelled.payload["why"] == f"its ancestor {parent.id} was cancelled"
    assert events(child, "step_started", "notify") == [], describe(child)
    assert webhook_receiver.requests == []


def test_a_sweep_that_finds_a_live_child_under_a_cancelled_parent_ends_it_cancelled(
    celery_workers, webhook_receiver, redis_broker
):
    parent, child = _a_live_child_under_a_cancelled_parent(webhook_receiver)
    approval_decide(run_id=child.id, step_id="ok", approved=True, by="ops")
    redis_broker.flushdb()  # its walk's message is lost: only the sweep can move it now
    RunLock.objects.filter(run_id=child.id).update(expires_at=timezone.now())
    child.refresh_from_db()
    assert child.status == RunStatus.RUNNING, describe(child)
    celery_workers({**webhook_receiver.env(), "PAL_SLICE_SECONDS": "60"}, name="tree-sweep", **QUICK)

    sweep = sweep_once(who="test-beat")

    child.refresh_from_db()
    assert child.status == RunStatus.CANCELLED, describe(child)
    assert str(child.id) not in sweep.redriven and events(child, "run_redriven") == []
    (cancelled,) = events(child, "run_cancelled")
    assert (cancelled.payload["by"], cancelled.payload["why"]) == ("sweep", f"its ancestor {parent.id} was cancelled")
    assert webhook_receiver.requests == []

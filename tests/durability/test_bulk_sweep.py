"""A bulk action whose task was lost with the broker (a Redis flush) is finished by the sweep, on real workers."""

import base64
import json

import pytest

from runs.models import BulkAction, BulkStatus, Run, RunStatus, Sweep
from runs.recovery import sweep_once
from runs.services import bulk_start
from tests.helpers import QUICK, describe, echo, events, start_run, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

APPROVAL = {"id": "review", "kind": "approval", "prompt": "Go on?"}


def queued_tasks(redis_broker) -> list[tuple[str, list]]:
    """(task name, args) of every message waiting in the broker's default queue."""
    found = []
    for raw in redis_broker.lrange("celery", 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], args))
    return found


def test_a_bulk_action_lost_with_the_broker_is_finished_after_the_sweep_sends_it_again(
    celery_workers, redis_broker, settings
):
    settings.PAL_RECOVERY_INTERVAL = 1  # the grace: max(interval, lease TTL) = 2 s
    runs = [start_run(APPROVAL, echo("after")) for _ in range(3)]  # they never end by themselves
    bulk = bulk_start(action="cancel", filters={"ids": [str(r.id) for r in runs]}, reason="cleanup", by="otto")
    assert ("runs.tasks.bulk", [bulk.id]) in queued_tasks(redis_broker)
    redis_broker.flushdb()  # the broker lost every message: the bulk task and the runs' first drives

    early = sweep_once(who="test-beat")
    assert early.bulk_resent == []  # within its grace the message may still be in the broker
    celery_workers(name="bulk", **QUICK)

    def finished():
        sweep_once(who="test-beat")
        return BulkAction.objects.filter(id=bulk.id, status=BulkStatus.DONE).exists()

    wait_until(
        finished,
        timeout=60,
        what=f"bulk action {bulk.id} to finish",
        explain=lambda: (
            f"{BulkAction.objects.filter(id=bulk.id).values().first()}\n" + "\n".join(describe(r) for r in runs)
        ),
    )
    bulk.refresh_from_db()
    assert (bulk.done, bulk.failed, bulk.position, bulk.errors) == (3, 0, 3, [])
    assert {r.status for r in Run.objects.filter(id__in=[r.id for r in runs])} == {RunStatus.CANCELLED}
    assert [len(events(r, "run_cancelled")) for r in runs] == [1, 1, 1]
    # Sent again by a sweep (this test's or one a worker ran at a lease's expiry), and only ever this action: on a
    # loaded machine the worker may not reach it within the next sweep's grace and get it twice; the counts above
    # show that no run was cancelled twice either way.
    resent = [s.bulk_resent for s in Sweep.objects.order_by("started_at") if s.bulk_resent]
    assert resent and all(ids == [bulk.id] for ids in resent), resent

"""A retry is a start (issue 23, section 2): with `max_runs: 1`, retrying a failed run while another run of its group
runs leaves the retried run queued on the group, saying why, until the slot frees; never two running at once.

A real worker, Postgres and Redis, a real webhook receiver that refuses the first delivery (the run fails
definitely) and takes the retry's."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunStatus
from runs.services import bulk_start, run_create, run_retry, workflow_create
from tests.helpers import QUICK, describe, events, wait_for_end, wait_until, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ONE_SLICE = {"PAL_SLICE_SECONDS": "60"}


def _failed_and_busy(celery_workers, webhook_receiver) -> tuple[Run, Run]:
    """A failed run of the group `one-at-a-time` and another of it that holds the group's only slot."""
    workflow_create(
        definition={
            "name": "one-at-a-time",
            "concurrency": {"max_runs": 1},
            "steps": [
                webhook("notify", webhook_receiver.url, {"n": "{{ input.n }}"}),
                {"id": "work", "kind": "tool_call", "tool": "sleep", "args": {"seconds": "{{ input.seconds }}"}},
            ],
        }
    )
    celery_workers({**webhook_receiver.env(), **ONE_SLICE}, name="retry-slot", concurrency=2, **QUICK)
    webhook_receiver.fail_next(1, status=400)  # a definite refusal: the first run fails in `notify`
    failed, _ = run_create(workflow_name="one-at-a-time", input={"n": 1, "seconds": 0})
    failed = wait_for_end(failed, timeout=60)
    assert failed.status == RunStatus.FAILED, describe(failed)
    busy, _ = run_create(workflow_name="one-at-a-time", input={"n": 2, "seconds": 4})
    wait_until(lambda: events(busy, "step_started", "work"), timeout=30, what="the second run to hold the slot")
    return failed, busy


def _assert_queued_behind(retried: Run, busy: Run) -> None:
    retried.refresh_from_db()
    busy.refresh_from_db()
    assert busy.status == RunStatus.RUNNING, describe(busy)
    assert retried.status == RunStatus.QUEUED, describe(retried)
    assert run_why(retried).startswith("concurrency one-at-a-time:: 1 of 1 running"), run_why(retried)
    (event,) = events(retried, "run_retried")
    assert event.payload["queued"]["kind"] == "concurrency" and event.payload["task_id"] is None

    busy, retried = wait_for_end(busy, timeout=60), wait_for_end(retried, timeout=60)
    assert (busy.status, retried.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED), describe(retried)
    # The retried run went on only once the busy one had ended: never two running at once.
    (busy_end,) = events(busy, "run_succeeded")
    restart = events(retried, "run_started")[-1]
    assert restart.payload.get("resumed") is True and restart.created_at >= busy_end.created_at, describe(retried)
    assert Run.objects.filter(workflow__name="one-at-a-time", status=RunStatus.RUNNING).count() == 0


def test_a_retry_while_the_group_is_full_waits_queued_with_why(celery_workers, webhook_receiver):
    failed, busy = _failed_and_busy(celery_workers, webhook_receiver)

    run_retry(run_id=failed.id, by="ops", reason="the receiver is back")

    _assert_queued_behind(failed, busy)


def test_a_bulk_retry_while_the_group_is_full_waits_queued_too(celery_workers, webhook_receiver):
    failed, busy = _failed_and_busy(celery_workers, webhook_receiver)

    bulk = bulk_start(action="retry", filters={"ids": [str(failed.id)]}, reason="the receiver is back", by="ops")
    wait_until(lambda: events(failed, "run_retried"), timeout=30, what=f"bulk action {bulk.id} to retry the run")

    _assert_queued_behind(failed, busy)

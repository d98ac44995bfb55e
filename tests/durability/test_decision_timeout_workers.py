"""An approval's 30 s timeout on real workers and a real `celery -A pal beat` (issue 28): nobody decides, and the
engine decides it at its deadline through the durable timer (the wake-up task a worker holds until its time; the
beat's look and the sweep as its backstop), journaled approval_decided by "timeout". Its lateness is the journal row's
created_at against the deadline, both by the database's clock; the issue asks for it within 2 s."""

import pytest
from django.utils.dateparse import parse_datetime

from tests.helpers import QUICK, describe, echo, start_run, wait_for_end, wait_for_event
from tests.support.workers import start_beat, stop_beat

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TIMEOUT = 30


def approval(**fields) -> dict:
    return {"id": "review", "kind": "approval", "prompt": "Anyone?", "timeout_seconds": TIMEOUT, **fields}


def test_a_30_second_timeout_is_decided_by_the_engine_within_2_seconds_of_its_deadline(
    celery_workers, worker_env, tmp_path
):
    beat = start_beat({**worker_env, "PAL_RECOVERY_INTERVAL": "5"}, tmp_path / "beat")
    try:
        celery_workers({"PAL_RECOVERY_INTERVAL": "5"}, name="timeouts", concurrency=2, **QUICK)
        rejected = start_run(approval(), echo("after"))
        approved = start_run(approval(on_timeout="approve"), echo("after"))
        lateness = {}
        for run, ending in ((rejected, "failed"), (approved, "succeeded")):
            requested = wait_for_event(run, "approval_requested", "review", timeout=30)
            decided = wait_for_event(run, "approval_decided", "review", timeout=TIMEOUT + 30)
            deadline = parse_datetime(requested.payload["deadline"])
            lateness[ending] = (decided.created_at - deadline).total_seconds()
            assert decided.payload["by"] == "timeout" and decided.payload["timed_out"] is True, describe(run)
            run = wait_for_end(run, timeout=30)
            assert run.status == ending, describe(run)
    finally:
        stop_beat(beat)
    print(f"decided after the deadline (s, the database's clock): {lateness}")
    assert all(0 <= late < 2 for late in lateness.values()), lateness
    rejected.refresh_from_db()
    assert rejected.error["code"] == "approval_timed_out"

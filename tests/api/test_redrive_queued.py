"""POST /runs/{id}/redrive of a waiting run whose concurrency group is full, forced: 202 with the run queued on its
group and its why, no task booked (runs.services.run_redrive; docs/FLOW-CONTROL.md)."""

import pytest

from runs.models import RunLock
from tests.helpers import events
from tests.services.test_redrive_concurrency import waiting_behind_a_holder

pytestmark = pytest.mark.django_db


def test_a_forced_redrive_of_a_waiting_run_of_a_full_group_answers_202_with_the_run_queued_and_why(operator, settings):
    settings.PAL_SLICE_SECONDS = 0.000001
    waiting, _ = waiting_behind_a_holder()

    response = operator.post(f"/runs/{waiting.id}/redrive", {"reason": "kick it", "force": True})

    assert response.status_code == 202
    run = response.json()
    assert run["status"] == "queued" and run["why"].startswith("concurrency gate:acme: 1 of 1 running")
    assert run["waiting_on"] == {"kind": "concurrency", "key": "gate:acme", "running": 1, "max_runs": 1}
    assert not RunLock.objects.filter(run_id=waiting.id).exists()
    event = events(waiting)[-1]
    assert event.kind == "run_redriven" and event.payload["queued"]["key"] == "gate:acme"

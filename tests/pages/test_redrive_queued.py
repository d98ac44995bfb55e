"""The run page's re-drive of a waiting run whose concurrency group is full says that the run now waits for a slot,
and why, instead of a bare "Re-driven" (runs.pages.run, runs.services.run_redrive)."""

import pytest

from runs.models import RunStatus
from tests.helpers import drive
from tests.pages.conftest import htmx
from tests.services.test_redrive_concurrency import gate, start, waiting_behind_a_holder

pytestmark = pytest.mark.django_db


def test_a_redrive_from_the_run_page_of_a_run_whose_group_is_full_says_it_waits_for_a_slot(operator, settings):
    settings.PAL_SLICE_SECONDS = 0.000001
    waiting, _ = waiting_behind_a_holder()

    response = operator.post(
        f"/runs/{waiting.id}/redrive/", {"reason": "kick it", "force": "1"}, headers=htmx("run-actions")
    )

    text = response.content.decode()
    assert response.status_code == 200
    assert "Re-driven (forced) by otto: kick it. Its group is full, so it waits: concurrency gate:acme: 1 of 1" in text
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED


def test_a_redrive_from_the_run_page_with_a_free_slot_says_only_re_driven(operator, settings):
    settings.PAL_SLICE_SECONDS = 0.000001
    gate()
    waiting = start(ask=True)
    drive(waiting)

    response = operator.post(f"/runs/{waiting.id}/redrive/", {"reason": "kick it"}, headers=htmx("run-actions"))

    text = response.content.decode()
    assert response.status_code == 200 and "Re-driven by otto: kick it" in text and "Its group is full" not in text
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.RUNNING

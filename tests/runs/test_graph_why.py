"""Why a graph's run is not moving when several of its branches wait (issue 12): every wait is said, on the run
page's and the API's `why` and in the runs list's state line."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.explain import run_state_line, run_why
from runs.models import Run, RunStatus
from runs.services import approval_decide
from tests.api.conftest import Api, make_user, token_for
from tests.helpers import drive_to_end, make_run, tool_step

pytestmark = pytest.mark.django_db

BOTH = "waiting on the approval of step 'legal' and the approval of step 'money'"


def two_approvals() -> Run:
    run = make_run(
        steps=[
            {"id": "legal", "kind": "approval", "prompt": "legal?", "needs": []},
            {"id": "money", "kind": "approval", "prompt": "money?", "needs": []},
            tool_step("end", "echo", {"done": True}, needs=["legal", "money"]),
        ]
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    return run


def test_a_run_waiting_on_two_branches_says_both_waits_in_its_why_and_its_state_line():
    run = two_approvals()

    assert run_why(run) == BOTH
    assert run_state_line(run, lease=None, now=timezone.now()) == BOTH


def test_the_api_says_every_wait_and_once_one_is_decided_only_the_other():
    run = two_approvals()
    viewer = Api(token_for(make_user("vera", "runs.view_run")))
    assert viewer.get(f"/runs/{run.id}").json()["why"] == BOTH

    approval_decide(run_id=run.id, step_id="money", approved=True, by="otto")
    drive_to_end(run)

    assert viewer.get(f"/runs/{run.id}").json()["why"] == "waiting on the approval of step 'legal'"


def test_waits_of_every_kind_are_joined_in_the_order_the_run_lists_them():
    until = timezone.now() + timedelta(hours=1)
    waits = [
        {"kind": "signal", "step_id": "hear", "name": "go"},
        {"kind": "timer", "step_id": "nap", "until": until.isoformat()},
        {"kind": "approval", "step_id": "ok"},
        {"kind": "telepathy", "step_id": "odd"},
    ]
    run = Run(status=RunStatus.WAITING, waiting_on={**waits[0], "waits": waits}, wake_at=until)

    assert run_state_line(run, lease=None, now=timezone.now()) == (
        f"waiting on the signal 'go' (step 'hear'), a timer until {until.isoformat()}, the approval of step 'ok' "
        'and {"kind": "telepathy", "step_id": "odd"}'
    )


def test_a_single_wait_reads_as_it_always_did():
    run = Run(
        status=RunStatus.WAITING,
        waiting_on={"kind": "approval", "step_id": "ok", "waits": [{"kind": "approval", "step_id": "ok"}]},
    )

    assert run_state_line(run, lease=None, now=timezone.now()) == "waiting on the approval of step 'ok'"

"""A graph's run waiting on several approvals at once (issue 12, "waiting inside a graph"): the run page has a form for
each, /ops/ lists and counts each, and each form decides its own approval, through the same service as the API."""

import re

import pytest

from runs.explain import run_why
from runs.models import RunStatus
from runs.selectors import approvals_pending
from tests.helpers import drive_to_end, make_run, step_events, tool_step

from .conftest import htmx

pytestmark = pytest.mark.django_db


def two_approvals():
    run = make_run(
        steps=[
            {"id": "legal", "kind": "approval", "prompt": "Legal says yes?", "needs": []},
            {"id": "money", "kind": "approval", "prompt": "Budget says yes?", "needs": []},
            tool_step("end", "echo", {"done": True}, needs=["legal", "money"]),
        ]
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    return run


def forms_on(page: str) -> list[str]:
    """The step ids whose approval form the page shows, in order."""
    return re.findall(r'<form class="approval" method="post" action="/runs/[0-9a-f-]+/approvals/([^/"]+)/"', page)


def ops_count(client) -> int:
    page = client.get("/ops/").content.decode()
    found = re.search(r'<h2>Pending approvals <span class="pill">(\d+)</span>', page)
    assert found, "the dashboard has no pending approvals card"
    return int(found.group(1))


def test_the_run_page_shows_a_form_for_each_approval_and_deciding_one_leaves_the_run_waiting_on_the_other(operator):
    run = two_approvals()
    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert forms_on(page) == ["legal", "money"]
    assert "Legal says yes?" in page and "Budget says yes?" in page
    assert ops_count(operator) == 2

    decided = operator.post(
        f"/runs/{run.id}/approvals/money/",
        {"approved": "1", "attempt": "1", "page": str(run.id)},
        headers=htmx("run-actions"),
    )
    assert decided.status_code == 200 and "Approved step money" in decided.content.decode()
    drive_to_end(run)

    assert run.status == RunStatus.WAITING
    assert run_why(run) == "waiting on the approval of step 'legal'"
    assert forms_on(operator.get(f"/runs/{run.id}/").content.decode()) == ["legal"]
    assert ops_count(operator) == 1

    operator.post(f"/runs/{run.id}/approvals/legal/", {"approved": "1", "attempt": "1"}, headers=htmx("run-actions"))
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED and run.output == {"done": True}
    assert sorted(e.step_id for e in step_events(run, "approval_decided")) == ["legal", "money"]
    assert ops_count(operator) == 0
    assert "No run waits on an approval." in operator.get("/ops/").content.decode()


def test_a_for_each_over_an_approval_has_a_form_per_item_and_a_dashboard_row_decides_its_own_item(operator):
    run = make_run(
        steps=[{"id": "ship", "kind": "approval", "prompt": "Ship {{ item }}?", "for_each": "{{ input.parcels }}"}],
        input={"parcels": ["north", "south"]},
    )
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert forms_on(page) == ["ship%5B0%5D", "ship%5B1%5D"]
    assert "Ship north?" in page and "Ship south?" in page
    ops = operator.get("/ops/").content.decode()
    # Each row its own htmx target: the run's first wait keeps the run's id, the other adds its item.
    assert f'id="approval-{run.id}"' in ops and f'id="approval-{run.id}-ship-I1"' in ops
    assert f'hx-target="#approval-{run.id}-ship-I1"' in ops

    row = operator.post(
        f"/runs/{run.id}/approvals/ship[1]/",
        {"approved": "0", "comment": "wrong address"},
        headers=htmx(f"approval-{run.id}-ship-I1"),
    )

    assert row.status_code == 200
    text = row.content.decode()
    assert text.lstrip().startswith(f'<div class="approval-row" id="approval-{run.id}-ship-I1"')
    assert "Rejected step ship[1]" in text and "is now running" in text
    (decision,) = step_events(run, "approval_decided")
    assert (decision.step_id, decision.payload["approved"], decision.payload["comment"]) == (
        "ship[1]",
        False,
        "wrong address",
    )
    assert [item.step_id for item in approvals_pending()] == []  # it runs now: nothing waits until it parks again


def test_a_refused_decision_from_a_dashboard_row_shows_that_rows_form_again_under_the_same_id(operator):
    run = two_approvals()
    target = f"approval-{run.id}-money"

    stale = operator.post(f"/runs/{run.id}/approvals/money/", {"approved": "1", "attempt": "2"}, headers=htmx(target))

    assert stale.status_code == 409
    text = stale.content.decode()
    assert text.lstrip().startswith(f'<div class="approval-row" id="{target}"')
    assert forms_on(text) == ["money"] and f'hx-target="#{target}"' in text
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and not step_events(run, "approval_decided")


def test_a_viewer_sees_every_pending_approval_on_the_dashboard_without_a_form(viewer):
    run = two_approvals()

    page = viewer.get("/ops/").content.decode()

    assert forms_on(page) == []
    assert "Legal says yes?" in page and "Budget says yes?" in page
    assert f'id="approval-{run.id}"' in page and f'id="approval-{run.id}-money"' in page

"""The Django admin: raw records, the journal read-only on the run's page, and re-drive / cancel actions that
ask for a reason and go through the same services as the API, journaled with the operator's name."""

import pytest
from django.contrib.auth.models import Permission, User

from runs.models import Run, RunStatus
from tests.helpers import drive, echo_step, make_run, step_events, tool_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("alice", "alice@example.com", "pw")
    client.force_login(user)
    return client


def post_action(client, action, runs, **extra):
    return client.post("/admin/runs/run/", {"action": action, "_selected_action": [str(r.id) for r in runs], **extra})


def test_the_run_list_and_a_run_page_show_the_journal_read_only(admin_client):
    run = make_run(steps=[echo_step("a", x=1)])
    drive(run)
    assert admin_client.get("/admin/runs/run/").status_code == 200
    page = admin_client.get(f"/admin/runs/run/{run.id}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "run_succeeded" in body and "step_completed" in body
    assert f'href="/runs/{run.id}/"' in body  # the link to the operator's run page
    assert 'name="_save"' not in body  # read-only


def test_a_redrive_action_first_asks_for_a_reason(admin_client):
    run = make_run(steps=[echo_step("a")])
    answer = post_action(admin_client, "redrive_runs", [run])
    assert answer.status_code == 200
    assert "Reason" in answer.content.decode()
    assert step_events(run, "run_redriven") == []


def test_a_redrive_with_a_reason_is_journaled_with_the_operator(admin_client):
    run = make_run(steps=[tool_step("a", "sleep", {"seconds": 0})])
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    from django.utils import timezone

    from runs.models import RunLock

    RunLock.objects.filter(run_id=run.id).update(expires_at=timezone.now())  # the booked task died
    answer = post_action(admin_client, "redrive_runs", [run], reason="worker host rebooted", confirm="yes")
    assert answer.status_code == 302
    redriven = step_events(run, "run_redriven")
    assert len(redriven) == 1
    assert redriven[0].payload["by"] == "alice"
    assert redriven[0].payload["why"] == "worker host rebooted"


def test_a_redrive_is_refused_while_a_live_lease_holds_the_run(admin_client):
    run = make_run(steps=[echo_step("a")])  # booked for its first task: a live lease
    answer = post_action(admin_client, "redrive_runs", [run], reason="impatient", confirm="yes")
    assert answer.status_code == 302
    assert step_events(run, "run_redriven") == []
    messages = [str(m) for m in answer.wsgi_request._messages]
    assert any("live lease" in m for m in messages)


def test_a_cancel_with_a_reason_cancels_and_names_the_operator(admin_client):
    run = make_run(steps=[echo_step("a")])
    post_action(admin_client, "cancel_runs", [run], reason="wrong input", confirm="yes")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    cancelled = step_events(run, "run_cancelled")
    assert cancelled[0].payload == {"by": "alice", "reason": "wrong input", "who": "alice", "why": "wrong input"}


def test_staff_without_the_operate_permission_see_no_actions(client):
    viewer = User.objects.create_user("victor", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    make_run(steps=[echo_step("a")])
    page = client.get("/admin/runs/run/")
    assert page.status_code == 200
    assert "redrive_runs" not in page.content.decode()
    assert "cancel_runs" not in page.content.decode()


def test_the_double_budget_action_doubles_the_caps_with_a_reason_and_the_waiting_run_goes_on(admin_client):
    from runs.models import Workflow
    from runs.services import workflow_create
    from tests.helpers import drive_to_end

    workflow_create(
        definition={
            "name": "admin-capped",
            "budget": {"max_tokens": 1},
            "steps": [
                {"id": "a", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "one"},
                {"id": "b", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "two"},
            ],
        }
    )
    run = make_run(workflow=Workflow.objects.get(name="admin-capped"))
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "budget"

    post_action(admin_client, "double_budget", [run], reason="a little more", confirm="yes")

    (raised,) = step_events(run, "budget_raised")
    assert (raised.payload["max_tokens"], raised.payload["by"], raised.payload["why"]) == (2, "alice", "a little more")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # woken and booked: its walk checks the new cap

"""The pause forms (issue 27): pause from the run page, the workflow page and /ops/, resume from /ops/ and the
workflow page (paced when a per second is given), and the admin's resume action: all through runs.services, with the
operator's name and reason; a refusal is a message on the page, never a 500."""

import pytest
from django.contrib.auth.models import User

from runs.models import Pause
from runs.services import pause_create
from tests.helpers import echo, make_run, make_workflow

pytestmark = pytest.mark.django_db


def test_an_operator_pauses_a_run_from_its_page_and_comes_back_to_it(operator):
    run = make_run()
    page = operator.get(f"/runs/{run.id}/").content.decode()
    assert 'id="pause-run"' in page

    response = operator.post(
        "/pauses/", {"scope": "run", "target": str(run.id), "reason": "look at it", "next": f"/runs/{run.id}/"}
    )

    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    pause = Pause.objects.get()
    assert pause.scope == "run" and pause.target == str(run.id) and pause.by == "otto"


def test_the_workflow_page_pauses_and_resumes_its_workflow(operator):
    make_workflow(steps=[echo("a")], name="billing")
    operator.post("/pauses/", {"scope": "workflow", "target": "billing", "reason": "bad prompt", "next": "/x"})
    pause = Pause.objects.get(target="billing")
    page = operator.get("/workflows/billing/").content.decode()
    assert "Paused by otto: bad prompt" in page

    operator.post(f"/pauses/{pause.id}/resume/", {"reason": "mended", "per_second": "3", "next": "/workflows/billing/"})

    pause.refresh_from_db()
    assert not pause.active and pause.per_second == 3 and pause.resume_reason == "mended"


def test_ops_lists_the_pauses_and_a_refused_one_is_a_message(operator):
    pause_create(scope="dependency", target="email", by="alice", reason="smtp outage")
    page = operator.get("/ops/").content.decode()
    assert "smtp outage" in page and "dependency email" in page

    refused = operator.post("/pauses/", {"scope": "dependency", "target": "email", "reason": "again"}, follow=True)

    assert refused.status_code == 200 and "Not paused: dependency email is paused already" in refused.content.decode()
    bad_pace = operator.post(
        f"/pauses/{Pause.objects.get().id}/resume/", {"reason": "x", "per_second": "fast"}, follow=True
    )
    assert "per_second is a number" in bad_pace.content.decode() and Pause.objects.get().active


def test_a_viewer_may_not_pause(viewer):
    assert viewer.post("/pauses/", {"scope": "fleet", "reason": "x"}).status_code == 403
    assert not Pause.objects.exists()


def test_the_admin_resumes_the_selected_pauses_with_a_reason(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    pause = pause_create(scope="fleet", target="*", by="alice", reason="deploy")
    selected = {"action": "resume_pauses", "_selected_action": [str(pause.id)]}

    asked = client.post("/admin/runs/pause/", selected)
    client.post("/admin/runs/pause/", {**selected, "confirm": "yes", "reason": "deployed"})

    assert "give a reason" in asked.content.decode()
    pause.refresh_from_db()
    assert not pause.active and pause.resumed_by == "root" and pause.resume_reason == "deployed"

"""The reruns pages (issue 27, section 3): /reruns/ previews what a filter selects and what each run would reuse and
run again (a reader may look), an operator names the incident and starts it; /reruns/<id>/ shows its progress
(the fragment stops htmx's polling once it is over) and aborts it. All through runs.services, with who and why."""

import pytest
from django.contrib.auth.models import User

from runs.models import Rerun, RerunStatus
from runs.services import rerun_advance, rerun_start
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, record_drive_sends, tool_step

from .conftest import htmx

pytestmark = pytest.mark.django_db

FLAKY = tool_step("charge", "test_fail_before", {"succeed_on": 2})


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    record_drive_sends(monkeypatch)
    monkeypatch.setattr("runs.dispatch.rerun", type("Sent", (), {"apply_async": lambda *a, **k: None})())


def failed_runs(n: int) -> list:
    workflow = make_workflow(steps=[echo_step("load"), FLAKY], name="billing")
    runs = [make_run(workflow=workflow, input={"n": i}) for i in range(n)]
    for run in runs:
        drive_to_end(run)
    return runs


def test_a_reader_previews_the_runs_a_filter_selects_but_gets_no_start_button(viewer):
    runs = failed_runs(2)

    page = viewer.get("/reruns/", {"workflow": "billing", "from_step": "failed", "preview": "1"}).content.decode()

    assert 'data-field="count">2 runs' in page
    assert all(f'data-run="{run.id}"' in page for run in runs)
    assert 'tag-reused mono">load' in page and 'tag-rerun mono" title="failed">charge #2' in page
    assert "rerun_new" not in page and 'action="/reruns/start/"' not in page
    assert "needs the operator permission" in page


def test_the_preview_fragment_for_htmx_and_a_bad_field_named(operator):
    failed_runs(1)

    fragment = operator.get("/reruns/", {"from_step": "failed", "preview": "1"}, headers=htmx("rerun-preview"))
    bad = operator.get("/reruns/", {"status": "running", "from_step": "failed", "preview": "1"})

    assert fragment.status_code == 200 and fragment.content.decode().startswith('<section class="card rerun-preview"')
    assert 'action="/reruns/start/"' in fragment.content.decode()
    assert bad.status_code == 422 and "filter.status: a rerun takes runs that ended" in bad.content.decode()


def test_an_operator_starts_a_rerun_from_the_preview_and_lands_on_its_page(operator):
    failed_runs(2)

    response = operator.post(
        "/reruns/start/",
        {"workflow": "billing", "from_step": "failed", "name": "INC-3", "reason": "psp down", "per_second": "2"},
    )

    rerun = Rerun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/reruns/{rerun.id}/"
    assert (rerun.name, rerun.by, rerun.reason, rerun.per_second, rerun.count) == ("INC-3", "otto", "psp down", 2, 2)
    page = operator.get(response["Location"]).content.decode()
    assert "Rerun “INC-3” started: 2 run(s)" in page and "0 of 2" in page and 'hx-trigger="every 1s"' in page


def test_a_refused_start_comes_back_to_the_preview_with_the_reason(operator):
    failed_runs(1)

    response = operator.post("/reruns/start/", {"from_step": "failed", "reason": " "}, follow=True)

    assert "Not started: a rerun needs a reason" in response.content.decode()
    assert 'data-field="count">1 run' in response.content.decode()  # the preview again
    assert not Rerun.objects.exists()


def test_the_progress_fragment_polls_until_the_rerun_and_the_runs_it_reran_are_over(operator):
    runs = failed_runs(2)
    rerun = rerun_start(filter={}, from_step="failed", reason="psp down", by="otto")
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    done_but_running = operator.get(f"/reruns/{rerun.id}/", headers=htmx("rerun-progress"))
    for run in runs:
        drive_to_end(run)
    over = operator.get(f"/reruns/{rerun.id}/", headers=htmx("rerun-progress"))

    assert done_but_running.status_code == 200 and 'hx-trigger="every 1s"' in done_but_running.content.decode()
    assert over.status_code == 286  # htmx's "stop polling"
    text = over.content.decode()
    assert "2 of 2" in text and "2 retried in place" in text and "hx-trigger" not in text
    assert text.count('<span class="status status-succeeded">succeeded</span>') == 2


def test_an_operator_aborts_a_rerun_from_its_page(operator):
    failed_runs(2)
    rerun = rerun_start(filter={}, from_step="failed", reason="psp down", by="alice", per_second=1)

    response = operator.post(f"/reruns/{rerun.id}/abort/", {"reason": "wrong workflow"}, follow=True)

    rerun.refresh_from_db()
    assert (rerun.status, rerun.aborted_by, rerun.abort_reason) == (RerunStatus.ABORTED, "otto", "wrong workflow")
    page = response.content.decode()
    assert "aborted after 0 of 2" in page and "not reached" in page
    assert f'action="/reruns/{rerun.id}/abort/"' not in page  # nothing left to abort


def test_a_viewer_may_not_start_or_abort_and_an_unknown_rerun_is_404(viewer, operator):
    failed_runs(1)
    rerun = rerun_start(filter={}, from_step="failed", reason="psp down", by="alice")

    assert viewer.post("/reruns/start/", {"from_step": "failed", "reason": "r"}).status_code == 403
    assert viewer.post(f"/reruns/{rerun.id}/abort/", {"reason": "r"}).status_code == 403
    assert Rerun.objects.count() == 1 and Rerun.objects.get().status == RerunStatus.RUNNING
    assert operator.get("/reruns/00000000-0000-0000-0000-000000000000/").status_code == 404
    listed = viewer.get("/reruns/")
    assert listed.status_code == 200 and f'href="/reruns/{rerun.id}/">psp down</a>' in listed.content.decode()


def test_the_admin_lists_reruns_read_only_and_aborts_the_selected_ones_with_a_reason(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    failed_runs(1)
    rerun = rerun_start(filter={}, from_step="failed", reason="psp down", by="alice", name="INC-5")
    selected = {"action": "abort_reruns", "_selected_action": [str(rerun.id)]}

    listed = client.get("/admin/runs/rerun/")
    asked = client.post("/admin/runs/rerun/", selected)
    client.post("/admin/runs/rerun/", {**selected, "confirm": "yes", "reason": "wrong filter"})

    assert "INC-5" in listed.content.decode() and "/admin/runs/rerun/add/" not in listed.content.decode()
    assert "give a reason" in asked.content.decode()
    rerun.refresh_from_db()
    assert (rerun.status, rerun.aborted_by, rerun.abort_reason) == (RerunStatus.ABORTED, "root", "wrong filter")

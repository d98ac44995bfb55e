"""The operator's pages: every page and fragment for each role (anonymous, no permission, viewer, operator), the
actions through the same services as the API, CSRF, and reads that do not grow with the run."""

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from journal.services import NewEvent
from runs.models import BulkAction, Run, RunLock, RunStatus, SideEffect, SideEffectStatus, Sweep
from runs.services import bulk_apply
from tests.helpers import (
    Crash,
    drive,
    drive_to_end,
    echo_step,
    expire_lease,
    journal_by_hand,
    make_run,
    make_workflow,
    step_events,
    sweep_after_expiry,
    tool_step,
)

from .conftest import htmx, logged_in, make_user

pytestmark = pytest.mark.django_db

APPROVAL = {"id": "review", "kind": "approval", "prompt": "Send the reply?"}


def body(response) -> str:
    return response.content.decode()


def finished_run(**kwargs) -> Run:
    run = make_run(steps=[echo_step("a", x=1), echo_step("b", y=2)], **kwargs)
    drive_to_end(run)
    return run


def stuck_run() -> Run:
    """Running, its worker gone: the lease expired and nobody re-drove it yet."""
    run = make_run(steps=[echo_step("a")])
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    RunLock.objects.filter(run_id=run.id).update(owner="worker-7:4242:dead")
    expire_lease(run)
    run.refresh_from_db()
    return run


def waiting_on_approval() -> Run:
    run = make_run(steps=[echo_step("a"), APPROVAL])
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def failed_run() -> Run:
    run = make_run(steps=[echo_step("a"), tool_step("boom", "test_fail")])
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    return run


def page_urls(run) -> list[str]:
    return [
        "/runs/",
        f"/runs/{run.id}/",
        f"/runs/{run.id}/waterfall/",
        f"/runs/{run.id}/receipt/",
        f"/runs/{run.id}/receipt/?format=json",
        f"/runs/{run.id}/redrive/",
        "/ops/",
    ]


def action_posts(run) -> list[tuple[str, dict]]:
    return [
        (f"/runs/{run.id}/cancel/", {"reason": "r"}),
        (f"/runs/{run.id}/redrive/", {"reason": "r"}),
        (f"/runs/{run.id}/retry/", {"reason": "r"}),
        (f"/runs/{run.id}/approvals/review/", {"approved": "1"}),
        (f"/runs/{run.id}/signals/", {"name": "go", "payload": "{}"}),
        ("/runs/bulk/", {"action": "cancel", "ids": [str(run.id)], "reason": "r"}),
    ]


# --- login and permissions ------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_the_login_page_from_every_page(anonymous):
    run = finished_run()
    for url in [*page_urls(run), f"/runs/{run.id}/events/stream", "/runs/bulk/1/"]:
        response = anonymous.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url


def test_anonymous_actions_are_sent_to_the_login_page_and_change_nothing(anonymous):
    run = make_run(steps=[echo_step("a")])
    for url, data in action_posts(run):
        response = anonymous.post(url, data)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED


def test_an_htmx_poll_after_the_session_ended_sends_the_window_to_the_login_page(anonymous):
    response = anonymous.get("/runs/", headers=htmx("run-rows"))
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith("/accounts/login/?next=")


def test_the_login_page_logs_in_and_goes_to_the_runs(db):
    user = make_user("lena", "runs.view_run")
    user.set_password("s3cret-pw")
    user.save()
    client = Client()
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "lena", "password": "s3cret-pw"})
    assert response.status_code == 302 and response["Location"] == "/runs/"
    assert client.get("/runs/").status_code == 200
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert client.get("/runs/").status_code == 302


def test_a_user_without_the_view_permission_is_refused_every_page(nobody):
    run = finished_run()
    for url in page_urls(run):
        response = nobody.get(url)
        assert response.status_code == 403, url
        assert "runs.view_run" in body(response), url


def test_a_viewer_reads_every_page_but_sees_no_action_forms(viewer):
    run = waiting_on_approval()
    for url in page_urls(run):
        assert viewer.get(url).status_code == 200, url
    page = body(viewer.get(f"/runs/{run.id}/"))
    assert "needs the operator permission" in page
    assert f'action="/runs/{run.id}/cancel/"' not in page
    assert "Approve" not in page
    assert 'name="ids"' not in body(viewer.get("/runs/"))  # no bulk selection either


def test_a_viewer_gets_403_on_every_action_and_nothing_changes(viewer):
    run = waiting_on_approval()
    before = len(step_events(run, "run_cancelled")) + len(step_events(run, "approval_decided"))
    for url, data in action_posts(run):
        response = viewer.post(url, data)
        assert response.status_code == 403, url
        assert "runs.operate" in body(response), url
    effect = SideEffect.objects.create(
        key=f"{run.id}:a:1",
        run=run,
        step_id="a",
        attempt=1,
        channel="email",
        target="x@example.com",
        status="unconfirmed",
        claimed_at=timezone.now(),
    )
    response = viewer.post(f"/ops/side-effects/{effect.id}/", {"decision": "mark_delivered", "reason": "r"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert len(step_events(run, "run_cancelled")) + len(step_events(run, "approval_decided")) == before
    assert SideEffect.objects.get(id=effect.id).status == "unconfirmed"


def test_an_htmx_action_refused_for_lack_of_permission_answers_a_line_of_text(viewer):
    run = make_run(steps=[echo_step("a")])
    response = viewer.post(f"/runs/{run.id}/cancel/", {"reason": "r"}, headers=htmx("run-actions"))
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/plain")
    assert body(response).startswith("Refused: this action needs the operator permission")


def test_actions_need_a_csrf_token(db):
    user = make_user("otto", "runs.view_run", "runs.operate")
    client = logged_in(user, enforce_csrf_checks=True)
    run = make_run(steps=[echo_step("a")])
    refused = client.post(f"/runs/{run.id}/cancel/", {"reason": "no token"})
    assert refused.status_code == 403 and "CSRF" in body(refused)
    refused = client.post(f"/runs/{run.id}/cancel/", {"reason": "no token"}, headers=htmx("run-actions"))
    assert refused.status_code == 403 and "CSRF" in body(refused)
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED

    page = client.get(f"/runs/{run.id}/")  # sets the CSRF cookie; the page carries the token for htmx
    token = client.cookies["csrftoken"].value
    assert re.search(r'hx-headers=\'\{"X-CSRFToken": "[^"]+"\}\'', body(page))
    accepted = client.post(
        f"/runs/{run.id}/cancel/", {"reason": "with the token"}, headers={**htmx("run-actions"), "X-CSRFToken": token}
    )
    assert accepted.status_code == 200
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED


def test_actions_answer_only_post(operator):
    run = make_run(steps=[echo_step("a")])
    assert operator.get(f"/runs/{run.id}/cancel/").status_code == 405
    assert operator.get(f"/runs/{run.id}/retry/").status_code == 405


def test_an_unknown_run_is_a_404(viewer):
    assert viewer.get(f"/runs/{Run().id}/").status_code == 404
    assert viewer.get("/runs/not-a-uuid/").status_code == 404


# --- the run list ---------------------------------------------------------------------------------


def test_the_run_list_shows_runs_newest_first_with_their_state(viewer):
    old = finished_run()
    new = waiting_on_approval()
    page = body(viewer.get("/runs/"))
    assert page.index(str(new.id)[:8]) < page.index(str(old.id)[:8])
    assert "waiting on the approval of step &#x27;review&#x27;" in page
    assert 'hx-trigger="every 4s"' in page  # the rows refresh themselves


def test_the_run_list_filters_by_status_workflow_parent_stuck_and_id(viewer):
    done = finished_run()
    stuck = stuck_run()
    other = make_run(workflow=make_workflow(name="other-flow", steps=[echo_step("z")]))

    def shown(**params):
        page = body(viewer.get("/runs/", params))
        return {r for r in (done, stuck, other) if f'data-run="{r.id}"' in page}

    assert shown() == {done, stuck, other}
    assert shown(status="succeeded") == {done}
    assert shown(workflow="other-flow") == {other}
    assert shown(stuck="1") == {stuck}
    assert shown(q=str(done.id)[:6]) == {done}
    assert shown(q=str(done.id)) == {done}
    assert shown(parent=str(done.id)) == set()


def test_bad_filters_are_named_and_dropped(viewer):
    page = body(viewer.get("/runs/", {"status": "sleeping", "parent": "nope", "cursor": "garbage"}))
    assert "unknown status" in page
    assert "is not a run id" in page
    assert "cursor is not one this API gave out" in page


def test_the_run_list_pages_with_a_cursor_and_keeps_the_filters(viewer):
    workflow = make_workflow(name="many", steps=[echo_step("a")])
    runs = [make_run(workflow=workflow) for _ in range(53)]
    first = body(viewer.get("/runs/", {"workflow": "many"}))
    older = re.search(r'href="\?([^"]*cursor=[^"]+)">older', first)
    assert older, "the first page links to the older runs"
    assert "workflow=many" in older.group(1)
    second = body(viewer.get("/runs/?" + older.group(1).replace("&amp;", "&")))
    on_first = {r.id for r in runs if f'data-run="{r.id}"' in first}
    on_second = {r.id for r in runs if f'data-run="{r.id}"' in second}
    assert len(on_first) == 50 and len(on_second) == 3 and not on_first & on_second
    assert "older →" not in second and "← newest" in second


def test_the_rows_fragment_is_only_the_rows_and_keeps_the_ticked_boxes(operator):
    run = make_run(steps=[echo_step("a")])
    response = operator.get("/runs/", {"ids": [str(run.id)]}, headers=htmx("run-rows"))
    assert response.status_code == 200
    fragment = body(response)
    assert fragment.lstrip().startswith("<tbody") and "<html" not in fragment
    assert re.search(rf'value="{run.id}"\s+checked', fragment)


def test_the_rows_fragment_reads_a_page_in_a_fixed_number_of_queries(viewer, django_assert_max_num_queries):
    workflow = make_workflow(name="counted", steps=[echo_step("a")])
    for _ in range(30):
        make_run(workflow=workflow)
    # session, user, permissions, the page, the page's attributes: not one per row; on Postgres also the page's plan
    # mode (SET LOCAL) in a transaction of its own (here a savepoint and its release: the test runs in a transaction)
    with django_assert_max_num_queries(10 if connection.vendor == "postgresql" else 7):
        viewer.get("/runs/", headers=htmx("run-rows"))


# --- bulk actions ---------------------------------------------------------------------------------


def test_a_bulk_action_shows_its_preview_count_first_then_starts_and_reports_progress(operator):
    workflow = make_workflow(name="bulky", steps=[echo_step("a")])
    live = [make_run(workflow=workflow) for _ in range(3)]
    done = make_run(workflow=workflow)
    drive_to_end(done)
    ids = [str(r.id) for r in [*live, done]]

    preview = operator.post(
        "/runs/bulk/",
        {"action": "cancel", "scope": "selected", "ids": ids, "reason": "cleanup", "step": "preview"},
        headers=htmx("bulk-result"),
    )
    assert preview.status_code == 200
    text = body(preview)
    assert "Cancel 3 runs" in text  # the finished one is left out
    assert BulkAction.objects.count() == 0  # nothing started yet
    previewed = re.search(r'name="previewed" value="([^"]+)"', text).group(1).replace("&quot;", '"')

    started = operator.post(
        "/runs/bulk/",
        {"action": "cancel", "previewed": previewed, "reason": "cleanup", "step": "start"},
        headers=htmx("bulk-result"),
    )
    assert started.status_code == 200
    bulk = BulkAction.objects.get()
    assert (bulk.action, bulk.total, bulk.created_by, bulk.reason) == ("cancel", 3, "otto", "cleanup")
    assert 'hx-trigger="every 1s"' in body(started)

    polling = operator.get(f"/runs/bulk/{bulk.id}/", headers=htmx("bulk-progress"))
    assert polling.status_code == 200 and 'hx-trigger="every 1s"' in body(polling)
    bulk_apply(bulk_id=bulk.id)  # what the Celery task does
    finished = operator.get(f"/runs/bulk/{bulk.id}/", headers=htmx("bulk-progress"))
    assert finished.status_code == 286  # htmx stops polling
    assert "3 done" in body(finished) and "every 1s" not in body(finished)
    assert {r.status for r in Run.objects.filter(id__in=[r.id for r in live])} == {RunStatus.CANCELLED}
    assert operator.get(f"/runs/bulk/{bulk.id}/").status_code == 200  # the page, without JavaScript


def test_a_bulk_action_over_every_run_matching_the_filters(operator):
    workflow = make_workflow(name="matching", steps=[echo_step("a")])
    for _ in range(2):
        make_run(workflow=workflow)
    make_run(steps=[echo_step("x")])  # another workflow: not matched
    preview = operator.post(
        "/runs/bulk/",
        {"action": "cancel", "scope": "matching", "workflow": "matching", "reason": "r", "step": "preview"},
        headers=htmx("bulk-result"),
    )
    assert "Cancel 2 runs" in body(preview)


def test_a_bulk_action_without_runs_or_a_reason_is_refused_readably(operator):
    response = operator.post(
        "/runs/bulk/", {"action": "cancel", "scope": "selected", "step": "preview"}, headers=htmx("bulk-result")
    )
    assert response.status_code == 400 and "tick at least one run" in body(response)
    run = make_run(steps=[echo_step("a")])
    response = operator.post(
        "/runs/bulk/",
        {"action": "cancel", "previewed": json.dumps({"ids": [str(run.id)]}), "step": "start"},
        headers=htmx("bulk-result"),
    )
    assert response.status_code == 400 and "a bulk action needs a reason" in body(response)


def test_a_bulk_action_works_without_javascript(operator):
    run = make_run(steps=[echo_step("a")])
    preview = operator.post("/runs/bulk/", {"action": "cancel", "ids": [str(run.id)], "reason": "r", "step": "preview"})
    assert preview.status_code == 200 and "<html" in body(preview) and "Cancel 1 run" in body(preview)
    started = operator.post(
        "/runs/bulk/",
        {"action": "cancel", "previewed": json.dumps({"ids": [str(run.id)]}), "reason": "r", "step": "start"},
    )
    assert started.status_code == 302 and started["Location"] == f"/runs/bulk/{BulkAction.objects.get().id}/"


# --- the run page ---------------------------------------------------------------------------------


def test_the_run_page_shows_header_waterfall_journal_and_links(viewer):
    run = make_run(
        steps=[
            {
                "id": "draft",
                "kind": "llm_call",
                "model": "gpt-4o-mini",
                "provider": "fake",
                "prompt": "Summarise {{ input.t }}",
            },
            echo_step("b"),
        ],
        input={"t": "printer on fire"},
    )
    drive_to_end(run)
    page = body(viewer.get(f"/runs/{run.id}/"))
    assert "status-succeeded" in page and run.workflow.name in page
    assert f"/admin/runs/run/{run.id}/change/" in page  # the raw record in the admin
    assert 'class="wf-bar bar-completed"' in page
    assert f"key {run.id}:draft:1" in page  # hover: timings and key
    for kind in ("run_created", "step_started", "step_completed", "run_succeeded"):
        assert f'<td class="kind">{kind}</td>' in page
    assert "<details><summary>" in page  # payloads fold
    assert f'data-stream="/runs/{run.id}/events/stream"' in page
    usage = step_events(run, "step_completed", "draft")[0].payload["output"]["usage"]
    assert f"{usage['prompt_tokens'] + usage['completion_tokens']} tokens" in page


def test_the_header_of_a_stuck_run_says_why_and_who_held_its_lease(viewer):
    run = stuck_run()
    response = viewer.get(f"/runs/{run.id}/", headers=htmx("run-header"))
    assert response.status_code == 200
    fragment = body(response)
    assert fragment.lstrip().startswith('<section id="run-header"')
    assert "Why it is not moving" in fragment and "expired" in fragment
    assert 'class="countdown expired"' in fragment and "data-expires=" in fragment
    assert "every 5s" in fragment  # a live run's header polls


def test_the_header_of_an_ended_run_stops_polling(viewer):
    run = finished_run()
    response = viewer.get(f"/runs/{run.id}/", headers=htmx("run-header"))
    assert response.status_code == 286
    assert "every 5s" not in body(response)


def test_tokens_and_cost_roll_up_over_child_runs(viewer):
    make_workflow(
        name="kid",
        steps=[{"id": "think", "kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake", "prompt": "hello"}],
    )
    parent = make_run(
        steps=[
            {"id": "think", "kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake", "prompt": "hi"},
            {"id": "sub", "kind": "child_run", "workflow": "kid", "input": {}},
        ]
    )
    drive_to_end(parent)
    assert parent.status == RunStatus.SUCCEEDED
    child = Run.objects.get(parent_run=parent)

    def tokens(run):
        usage = step_events(run, "step_completed", "think")[0].payload["output"]["usage"]
        return usage["prompt_tokens"] + usage["completion_tokens"]

    header = body(viewer.get(f"/runs/{parent.id}/", headers=htmx("run-header")))
    assert f">{tokens(parent) + tokens(child)} tokens" in header
    assert f"with its 1 descendant; this run alone {tokens(parent)} tokens" in header


def test_the_waterfall_marks_cached_steps_redrives_and_child_runs(viewer):
    make_workflow(name="kid2", steps=[echo_step("k")])
    run = make_run(
        steps=[
            echo_step("a"),
            {"id": "sub", "kind": "child_run", "workflow": "kid2", "input": {}},
            tool_step("crash", "test_crash_once"),
        ]
    )
    with pytest.raises(Crash):
        drive(run)
    sweep_after_expiry(run)  # the sweep re-drives: a and sub are reused from the journal
    drive_to_end(run)
    fragment = body(viewer.get(f"/runs/{run.id}/", headers=htmx("waterfall")))
    assert fragment.lstrip().startswith('<div id="waterfall"')
    assert "bar-cached" in fragment and "reused from the journal by the re-drive" in fragment
    assert "bar-interrupted" in fragment or "bar-completed" in fragment
    assert 'class="wf-line line-redrive"' in fragment and "by sweep: no live lease" in fragment
    child = Run.objects.get(parent_run=run)
    assert f'hx-get="/runs/{child.id}/waterfall/?axis=' in fragment  # expandable, on the parent's axis
    nested = viewer.get(f"/runs/{child.id}/waterfall/?axis=1700000000,1700000100", headers=htmx())
    assert nested.status_code == 200 and f'id="waterfall-{child.id}"' in body(nested)
    assert viewer.get(f"/runs/{child.id}/waterfall/").status_code == 200  # a page without JavaScript


def test_the_waterfall_draws_waits_as_markers(viewer):
    run = waiting_on_approval()
    fragment = body(viewer.get(f"/runs/{run.id}/", headers=htmx("waterfall")))
    assert 'class="wf-wait"' in fragment and "waiting on approval" in fragment
    assert "bar-waiting" in fragment


def test_the_run_page_reads_in_a_fixed_number_of_queries_however_many_steps(viewer, django_assert_max_num_queries):
    run = make_run(steps=[echo_step(f"s{i}") for i in range(120)])
    drive_to_end(run)
    with django_assert_max_num_queries(25):
        response = viewer.get(f"/runs/{run.id}/")
    assert body(response).count('class="wf-row"') == 120


def test_a_long_journal_shows_its_latest_events_and_loads_earlier_ones(viewer):
    run = make_run(steps=[echo_step("a")])
    for i in range(560):
        journal_by_hand(run, NewEvent("note_taken", payload={"i": i}))
    page = body(viewer.get(f"/runs/{run.id}/"))
    total = 561
    assert page.count('<tr class="ev ') == 500
    assert f'data-last-seq="{total}"' in page
    earlier = re.search(r'hx-get="/runs/[^"]+\?before_seq=(\d+)"', page)
    assert earlier and int(earlier.group(1)) == total - 499
    fragment = body(viewer.get(f"/runs/{run.id}/?before_seq={earlier.group(1)}", headers=htmx("journal-earlier")))
    assert fragment.count('<tr class="ev ') == total - 500
    assert 'data-seq="1"' in fragment and "journal-earlier" not in fragment  # nothing before seq 1
    no_js = body(viewer.get(f"/runs/{run.id}/?before_seq={earlier.group(1)}"))
    assert "back to the latest events" in no_js and 'data-latest=""' in no_js


def test_the_receipt_renders_as_a_fragment_a_page_and_json(viewer):
    run = finished_run()
    fragment = body(viewer.get(f"/runs/{run.id}/", headers=htmx("receipt")))
    assert fragment.lstrip().startswith('<section id="receipt"') and "step attempts" in fragment
    assert f"{run.id}" in fragment
    page = viewer.get(f"/runs/{run.id}/receipt/")
    assert page.status_code == 200 and "<html" in body(page)
    receipt = viewer.get(f"/runs/{run.id}/receipt/?format=json").json()
    assert receipt["run_id"] == str(run.id) and receipt["status"] == "succeeded"


def test_the_actions_fragment_and_the_redrive_preview(operator):
    run = stuck_run()
    actions = body(operator.get(f"/runs/{run.id}/", headers=htmx("run-actions")))
    assert actions.lstrip().startswith('<section id="run-actions"')
    assert "Re-drive" in actions and "Cancel the run" in actions and "Retry" not in actions
    preview = operator.get(f"/runs/{run.id}/redrive/", headers=htmx())
    assert preview.status_code == 200
    assert "runs</span> again, same attempt and key" in body(preview) or "for the first time" in body(preview)
    assert 'hx-target="#run-actions"' in body(preview) and 'name="reason" required' in body(preview)
    page = operator.get(f"/runs/{run.id}/redrive/")  # without JavaScript: a page with the same form
    assert page.status_code == 200 and "<html" in body(page) and 'name="force"' in body(page)


# --- actions --------------------------------------------------------------------------------------


def test_an_operator_cancels_a_run_and_the_answer_replaces_actions_and_header(operator):
    run = make_run(steps=[echo_step("a")])
    response = operator.post(f"/runs/{run.id}/cancel/", {"reason": "wrong input"}, headers=htmx("run-actions"))
    assert response.status_code == 200
    text = body(response)
    assert "Cancelled by otto: wrong input" in text
    assert '<section id="run-header"' in text and 'hx-swap-oob="true"' in text and "status-cancelled" in text
    assert step_events(run, "run_cancelled")[0].payload["by"] == "otto"


def test_a_cancel_needs_a_reason(operator):
    run = make_run(steps=[echo_step("a")])
    response = operator.post(f"/runs/{run.id}/cancel/", {"reason": " "}, headers=htmx("run-actions"))
    assert response.status_code == 400 and "a cancel needs a reason" in body(response)
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED


def test_a_refusal_is_a_readable_message_in_the_actions_panel(operator):
    run = finished_run()
    response = operator.post(f"/runs/{run.id}/cancel/", {"reason": "too late"}, headers=htmx("run-actions"))
    assert response.status_code == 409
    assert "has already ended (succeeded)" in body(response) and "notice-error" in body(response)


def test_a_redrive_is_refused_while_a_live_lease_holds_the_run_unless_forced(operator):
    run = make_run(steps=[echo_step("a")])  # booked for its first task: a live lease
    refused = operator.post(f"/runs/{run.id}/redrive/", {"reason": "impatient"}, headers=htmx("run-actions"))
    assert refused.status_code == 409
    text = body(refused)
    assert "held by a live lease" in text and "pass force to steal it" in text
    assert 'id="redrive-panel" open' in text and 'value="impatient"' in text  # the panel stays open, reason kept
    assert step_events(run, "run_redriven") == []
    epoch = RunLock.objects.get(run_id=run.id).epoch
    forced = operator.post(
        f"/runs/{run.id}/redrive/", {"reason": "worker wedged", "force": "1"}, headers=htmx("run-actions")
    )
    assert forced.status_code == 200 and "Re-driven (forced) by otto: worker wedged" in body(forced)
    redriven = step_events(run, "run_redriven")
    assert redriven[0].payload["who"] == "otto" and redriven[0].payload["force"] is True
    assert RunLock.objects.get(run_id=run.id).epoch == epoch + 1


def test_a_redrive_needs_a_reason(operator):
    run = stuck_run()
    response = operator.post(f"/runs/{run.id}/redrive/", {"reason": ""}, headers=htmx("run-actions"))
    assert response.status_code == 400 and "a re-drive needs a reason" in body(response)


def test_a_redrive_without_javascript_goes_back_to_the_run_page_with_a_message(operator):
    run = stuck_run()
    response = operator.post(
        f"/runs/{run.id}/redrive/", {"reason": "host rebooted", "next": f"/runs/{run.id}/#actions"}
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/#actions"
    assert "Re-driven by otto: host rebooted" in body(operator.get(response["Location"]))
    evil = operator.post(f"/runs/{run.id}/cancel/", {"reason": "r", "next": "https://evil.example/"})
    assert evil["Location"] == f"/runs/{run.id}/#actions"  # only our own addresses


def test_an_operator_retries_a_failed_run(operator):
    run = failed_run()
    page = body(operator.get(f"/runs/{run.id}/"))
    assert f'action="/runs/{run.id}/retry/"' in page
    response = operator.post(f"/runs/{run.id}/retry/", {"reason": "tool fixed"}, headers=htmx("run-actions"))
    assert response.status_code == 200 and "Retried by otto" in body(response)
    assert Run.objects.get(id=run.id).status == RunStatus.RUNNING
    assert step_events(run, "run_retried")[0].payload["why"] == "tool fixed"


def test_a_child_runs_approval_is_decided_from_the_parents_page(operator):
    make_workflow(name="needs-ok", steps=[APPROVAL])
    parent = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "needs-ok", "input": {}}])
    drive(parent)
    assert parent.status == RunStatus.WAITING
    child = Run.objects.get(parent_run=parent)
    page = body(operator.get(f"/runs/{parent.id}/"))
    assert f'hx-post="/runs/{child.id}/approvals/review/"' in page and "Send the reply?" in page
    response = operator.post(
        f"/runs/{child.id}/approvals/review/",
        {"approved": "1", "comment": "fine", "page": str(parent.id)},
        headers=htmx("run-actions"),
    )
    assert response.status_code == 200
    assert "Approved step review" in body(response)
    assert f'hx-get="/runs/{parent.id}/"' in body(response)  # the parent's panel and header come back
    decided = step_events(child, "approval_decided")[0].payload
    assert decided == {"approved": True, "by": "otto", "comment": "fine", "attempt": 1}
    assert Run.objects.get(id=parent.id).status == RunStatus.RUNNING  # the wake-up walked up the tree


def test_rejecting_an_approval_and_deciding_twice(operator):
    run = waiting_on_approval()
    response = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "0", "comment": "no"}, headers=htmx("run-actions")
    )
    assert response.status_code == 200 and "Rejected step review" in body(response)
    again = operator.post(f"/runs/{run.id}/approvals/review/", {"approved": "1"}, headers=htmx("run-actions"))
    assert again.status_code == 409 and "does not wait on approval" in body(again)


def test_an_operator_sends_a_signal_and_bad_json_is_named(operator):
    run = make_run(steps=[{"id": "ci", "kind": "signal", "name": "ci-done"}, echo_step("after")])
    drive(run)
    assert run.status == RunStatus.WAITING
    page = body(operator.get(f"/runs/{run.id}/", headers=htmx("run-actions")))
    assert "It waits on the signal <code>ci-done</code>" in page
    bad = operator.post(
        f"/runs/{run.id}/signals/", {"name": "ci-done", "payload": "{nope"}, headers=htmx("run-actions")
    )
    assert bad.status_code == 422 and "the payload is not JSON" in body(bad) and "{nope" in body(bad)
    sent = operator.post(
        f"/runs/{run.id}/signals/", {"name": "ci-done", "payload": '{"green": true}'}, headers=htmx("run-actions")
    )
    assert sent.status_code == 200 and "Signal &#x27;ci-done&#x27; sent" in body(sent)
    assert Run.objects.get(id=run.id).status == RunStatus.RUNNING


# --- the live journal (session auth) --------------------------------------------------------------


def drain(response) -> str:
    """Read an async streaming answer to its end from this (sync) test."""
    from asgiref.sync import async_to_sync

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def test_the_page_stream_replays_the_journal_of_an_ended_run_and_closes(viewer):
    run = finished_run()
    response = viewer.get(f"/runs/{run.id}/events/stream", {"after_seq": 2})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    text = drain(response)
    seqs = [int(s) for s in re.findall(r"^id: (\d+)$", text, re.M)]
    total = len(step_events(run, "step_completed")) + 5  # created, started, 2 x started, succeeded
    assert seqs == list(range(3, total + 1))
    assert "event:" not in text  # unnamed: one EventSource listener gets every kind
    last = json.loads(re.findall(r"^data: (.*)$", text, re.M)[-1])
    assert last["kind"] == "run_succeeded"


def test_the_page_stream_needs_the_view_permission_and_a_known_run(nobody, viewer):
    run = finished_run()
    assert nobody.get(f"/runs/{run.id}/events/stream").status_code == 403
    assert viewer.get(f"/runs/{Run().id}/events/stream").status_code == 404
    assert viewer.get(f"/runs/{run.id}/events/stream", headers={"Last-Event-ID": "x"}).status_code == 400


# --- the ops dashboard ----------------------------------------------------------------------------


def test_the_ops_dashboard_shows_stuck_runs_by_why_side_effects_approvals_sweeps_and_counts(viewer):
    stuck = stuck_run()
    waiting = waiting_on_approval()
    finished_run()
    effect = SideEffect.objects.create(
        key=f"{waiting.id}:mail:1",
        run=waiting,
        step_id="mail",
        attempt=1,
        channel="email",
        target="ops@example.com",
        status="unconfirmed",
        claimed_at=timezone.now(),
    )
    now = timezone.now()
    Sweep.objects.create(
        started_at=now - timedelta(seconds=3),
        finished_at=now - timedelta(seconds=2),
        examined=4,
        redriven=[str(stuck.id)],
        who="beat",
    )
    page = body(viewer.get("/ops/"))
    assert "Lease expired: its worker stopped heartbeating" in page and str(stuck.id)[:8] in page
    assert effect.key[37:] in page and "status-effect-unconfirmed" in page
    assert "Send the reply?" in page
    assert "last ran" in page and "re-drove 1" in page
    assert re.search(r"status-succeeded\">succeeded</span><strong>1</strong>", page)
    assert re.search(r"status-waiting\">waiting</span><strong>1</strong>", page)
    assert "Mark delivered" not in page  # a viewer decides nothing


def test_an_operator_marks_a_side_effect_delivered_from_the_dashboard(operator):
    run = finished_run()
    effect = SideEffect.objects.create(
        key=f"{run.id}:mail:1",
        run=run,
        step_id="mail",
        attempt=1,
        channel="email",
        target="ops@example.com",
        status="unconfirmed",
        claimed_at=timezone.now(),
    )
    page = body(operator.get("/ops/"))
    assert f'hx-post="/ops/side-effects/{effect.id}/"' in page and "Send again" in page
    response = operator.post(
        f"/ops/side-effects/{effect.id}/",
        {"decision": "mark_delivered", "reason": "in the inbox"},
        headers=htmx(f"effect-{effect.id}"),
    )
    assert response.status_code == 200 and "Marked delivered by otto" in body(response)
    assert SideEffect.objects.get(id=effect.id).status == SideEffectStatus.DELIVERED
    resolved = step_events(run, "side_effect_resolved")[0].payload
    assert (resolved["decision"], resolved["by"], resolved["why"]) == ("mark_delivered", "otto", "in the inbox")
    again = operator.post(
        f"/ops/side-effects/{effect.id}/",
        {"decision": "mark_delivered", "reason": "twice"},
        headers=htmx(f"effect-{effect.id}"),
    )
    assert again.status_code == 409 and "already delivered" in body(again)


def test_an_approval_is_decided_from_the_dashboard_row(operator):
    run = waiting_on_approval()
    response = operator.post(f"/runs/{run.id}/approvals/review/", {"approved": "1"}, headers=htmx(f"approval-{run.id}"))
    assert response.status_code == 200
    text = body(response)
    assert text.lstrip().startswith(f'<div class="approval-row" id="approval-{run.id}"')
    assert "Approved step review" in text and "is now running" in text


def test_the_page_stream_answers_204_once_the_run_is_over_and_nothing_is_left(viewer):
    run = finished_run()
    last = step_events(run, "run_succeeded")[0].seq
    response = viewer.get(f"/runs/{run.id}/events/stream", headers={"Last-Event-ID": str(last)})
    assert response.status_code == 204  # an EventSource stops reconnecting


def test_the_dashboards_counts_and_stuck_runs_refresh_as_fragments(viewer):
    stuck = stuck_run()
    counts = viewer.get("/ops/", headers=htmx("ops-counts"))
    assert counts.status_code == 200
    assert body(counts).lstrip().startswith('<section class="counts card" id="ops-counts"')
    assert 'hx-trigger="every 10s"' in body(counts) and "has never run" in body(counts)
    fragment = body(viewer.get("/ops/", headers=htmx("stuck")))
    assert fragment.lstrip().startswith('<section class="card" id="stuck"') and str(stuck.id)[:8] in fragment
    assert "<html" not in fragment

"""POST /runs (with Idempotency-Key), GET /runs (filters, cursor), GET /runs/{id} (lease, why)."""

import re
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.explain import run_why
from runs.models import Run, RunLock, RunStatus
from tests.helpers import drive, drive_to_end, echo_step, expire_lease, make_run, make_workflow, tool_step

from .conftest import Api, assert_error, make_user, token_for

RUN_FIELDS = {
    "id",
    "workflow",
    "version",
    "status",
    "input",
    "output",
    "error",
    "parent_run_id",
    "parent_step_id",
    "forked_from",
    "depth",
    "created_at",
    "started_at",
    "finished_at",
    "lease",
    "waiting_on",
    "why",
}


@pytest.fixture
def workflow(db):
    return make_workflow(name="hello", steps=[echo_step("only", said="hi")])


# --- POST /runs -------------------------------------------------------------------------------------


def test_starting_a_run_answers_201_with_the_run(operator, workflow):
    response = operator.post("/runs", {"workflow": "hello", "input": {"ticket": 1}})
    assert response.status_code == 201
    body = response.json()
    assert set(body) == RUN_FIELDS
    assert (body["workflow"], body["version"], body["status"], body["input"]) == ("hello", 1, "queued", {"ticket": 1})
    run = Run.objects.get(id=body["id"])
    assert run.created_by == "otto"
    assert body["lease"]["owner"].startswith("task:")


def test_a_run_can_pin_a_version(operator, workflow):
    make_workflow(name="hello", steps=[echo_step("a"), echo_step("b")])
    assert operator.post("/runs", {"workflow": "hello", "version": 1}).json()["version"] == 1
    assert operator.post("/runs", {"workflow": "hello"}).json()["version"] == 2


def test_the_same_key_and_body_answer_200_with_the_same_run(operator, workflow):
    first = operator.post("/runs", {"workflow": "hello", "input": {"a": 1}}, headers={"Idempotency-Key": "k-1"})
    again = operator.post("/runs", {"workflow": "hello", "input": {"a": 1}}, headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.count() == 1


def test_the_same_key_with_another_body_is_409(operator, workflow):
    operator.post("/runs", {"workflow": "hello", "input": {"a": 1}}, headers={"Idempotency-Key": "k-1"})
    response = operator.post("/runs", {"workflow": "hello", "input": {"a": 2}}, headers={"Idempotency-Key": "k-1"})
    assert_error(response, 409, "idempotency_conflict")
    assert Run.objects.count() == 1


def test_keys_belong_to_their_user(operator, workflow):
    other = Api(token_for(make_user("olga", "runs.operate")))
    mine = operator.post("/runs", {"workflow": "hello"}, headers={"Idempotency-Key": "same"})
    theirs = other.post("/runs", {"workflow": "hello", "input": {"x": 1}}, headers={"Idempotency-Key": "same"})
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


def test_without_a_key_each_post_is_a_new_run(operator, workflow):
    operator.post("/runs", {"workflow": "hello"})
    operator.post("/runs", {"workflow": "hello"})
    assert Run.objects.count() == 2


def test_an_unknown_workflow_is_404(operator, db):
    assert_error(operator.post("/runs", {"workflow": "nope"}), 404, "workflow_not_found")
    assert_error(operator.post("/runs", {"workflow": "hello", "version": 9}), 404, "workflow_not_found")


@pytest.mark.parametrize(
    "body,loc",
    [
        ({"input": {}}, "workflow"),
        ({"workflow": "hello", "input": [1]}, "input"),
        ({"workflow": "hello", "input": "text"}, "input"),
        ({"workflow": "hello", "version": 0}, "version"),
        ({"workflow": "hello", "version": "two"}, "version"),
        ({"workflow": ["hello"]}, "workflow"),
        ({"workflow": "hello", "priority": 101}, "priority"),
        ({"workflow": "hello", "priority": 1.5}, "priority"),
        ({"workflow": "hello", "priority": True}, "priority"),
    ],
)
def test_a_bad_run_body_is_422_naming_the_field(operator, workflow, body, loc):
    response = assert_error(operator.post("/runs", body), 422, "validation_error")
    assert loc in [e["loc"] for e in response["errors"]]


def test_a_too_long_key_is_422(operator, workflow):
    response = operator.post("/runs", {"workflow": "hello"}, headers={"Idempotency-Key": "k" * 201})
    assert_error(response, 422, "validation_error")


# --- GET /runs ----------------------------------------------------------------------------------------


def _ids(response):
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


def test_the_list_is_newest_first(viewer, workflow):
    runs = [make_run(workflow=workflow) for _ in range(3)]
    assert _ids(viewer.get("/runs")) == [str(r.id) for r in reversed(runs)]


def test_the_cursor_walks_every_run_once_while_new_runs_arrive(viewer, workflow):
    older = [make_run(workflow=workflow) for _ in range(5)]
    # Two runs at the same instant: the id breaks the tie.
    same = timezone.now() - timedelta(hours=1)
    Run.objects.filter(id__in=[older[0].id, older[1].id]).update(created_at=same)
    expected = [str(r.id) for r in Run.objects.order_by("-created_at", "-id")]
    seen, cursor = [], None
    while True:
        page = viewer.get("/runs", {"limit": 2, **({"cursor": cursor} if cursor else {})})
        seen += _ids(page)
        make_run(workflow=workflow)  # a new run arrives between pages: it belongs before the first page
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == expected


def test_the_last_page_has_no_cursor(viewer, workflow):
    make_run(workflow=workflow)
    assert viewer.get("/runs", {"limit": 1}).json()["next_cursor"] is None


def test_filters_by_status_workflow_and_parent(viewer, workflow):
    other = make_workflow(name="other", steps=[echo_step("a")])
    done = make_run(workflow=workflow)
    drive_to_end(done)
    queued = make_run(workflow=workflow)
    elsewhere = make_run(workflow=other)
    child = make_run(workflow=other)
    Run.objects.filter(id=child.id).update(parent_run=queued, parent_step_id="s", depth=1)
    assert _ids(viewer.get("/runs", {"status": "succeeded"})) == [str(done.id)]
    assert _ids(viewer.get("/runs", {"workflow": "hello"})) == [str(queued.id), str(done.id)]
    assert _ids(viewer.get("/runs", {"workflow": "other", "status": "queued"})) == [str(child.id), str(elsewhere.id)]
    assert _ids(viewer.get("/runs", {"parent": str(queued.id)})) == [str(child.id)]
    assert _ids(viewer.get("/runs", {"workflow": "nobody-has-this"})) == []


def test_stuck_lists_live_runs_without_a_live_lease(viewer, workflow):
    booked = make_run(workflow=workflow)
    expired = make_run(workflow=workflow)
    expire_lease(expired)
    unleased = make_run(workflow=workflow)
    RunLock.objects.filter(run_id=unleased.id).delete()
    finished = make_run(workflow=workflow)
    drive_to_end(finished)
    assert set(_ids(viewer.get("/runs", {"stuck": "true"}))) == {str(expired.id), str(unleased.id)}
    assert str(booked.id) in _ids(viewer.get("/runs", {"stuck": "false"}))


@pytest.mark.parametrize(
    "params,loc",
    [
        ({"status": "sleeping"}, "query.status"),
        ({"limit": -1}, "query.limit"),
        ({"limit": 0}, "query.limit"),
        ({"limit": 10_000}, "query.limit"),
        ({"limit": "many"}, "query.limit"),
        ({"parent": "not-a-uuid"}, "query.parent"),
        ({"workflow": "Not A Name"}, "query.workflow"),
        ({"stuck": "maybe"}, "query.stuck"),
    ],
)
def test_bad_filters_are_422(viewer, params, loc):
    body = assert_error(viewer.get("/runs", params), 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [loc]


@pytest.mark.parametrize("cursor", ["garbage", "e30", "WyJ4IiwieSJd", "!!!"])
def test_a_cursor_this_api_did_not_give_is_422(viewer, cursor):
    assert_error(viewer.get("/runs", {"cursor": cursor}), 422, "invalid_cursor")


# --- GET /runs/{id} -----------------------------------------------------------------------------------


def test_one_run_has_exactly_the_contract_fields(viewer, workflow):
    run = make_run(workflow=workflow, input={"q": "x"})
    body = viewer.get(f"/runs/{run.id}").json()
    assert set(body) == RUN_FIELDS
    assert body["input"] == {"q": "x"}
    lock = RunLock.objects.get(run_id=run.id)
    assert body["lease"]["owner"] == lock.owner and body["lease"]["epoch"] == lock.epoch


def test_a_finished_run_has_output_no_lease_and_no_why(viewer, workflow):
    run = make_run(workflow=workflow)
    drive_to_end(run)
    body = viewer.get(f"/runs/{run.id}").json()
    assert body["status"] == "succeeded"
    assert body["output"] == {"said": "hi"}
    assert body["lease"] is None and body["why"] is None
    assert body["started_at"] and body["finished_at"]


def test_a_failed_run_shows_its_error(viewer, db):
    run = make_run(steps=[tool_step("boom", "test_fail")])
    drive_to_end(run)
    body = viewer.get(f"/runs/{run.id}").json()
    assert body["status"] == "failed"
    assert body["error"]["step_id"] == "boom" and body["error"]["code"] == "test_refused"


def test_an_unknown_run_is_404_and_a_bad_id_422(viewer):
    assert_error(viewer.get(f"/runs/{uuid.uuid4()}"), 404, "run_not_found")
    body = assert_error(viewer.get("/runs/12345"), 422, "validation_error")
    assert body["errors"][0]["loc"] == "path.id"


# --- why ----------------------------------------------------------------------------------------------


def test_why_a_queued_run_waits_for_a_worker(workflow):
    run = make_run(workflow=workflow)
    why = run_why(run)
    assert why.startswith("queued for task ") and "waiting for a worker" in why


def test_why_a_booking_expired(workflow):
    run = make_run(workflow=workflow)
    expire_lease(run)
    why = run_why(run)
    assert "expired" in why and "no worker took it" in why and "sweep" in why


def test_why_a_run_has_no_lease(workflow):
    run = make_run(workflow=workflow)
    RunLock.objects.filter(run_id=run.id).delete()
    assert run_why(run).startswith("queued with no lease")
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    assert run_why(run).startswith("no lease")


def test_why_a_worker_lease_expired_names_holder_epoch_and_time(workflow):
    run = make_run(workflow=workflow)
    past = timezone.now() - timedelta(seconds=42)
    RunLock.objects.filter(run_id=run.id).update(owner="host:1:abc", epoch=7, expires_at=past)
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    why = run_why(run)
    assert why.startswith("lease expired: held by host:1:abc (epoch 7)")
    assert past.isoformat(timespec="seconds") in why
    assert re.search(r"\b(4[2-9]|5[0-9])s ago", why), why  # 42 s, and more when the machine was slow to get here


def test_why_a_held_run_names_its_holder_and_step(workflow):
    run = make_run(workflow=workflow)
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    RunLock.objects.filter(run_id=run.id).update(owner="host:2:def", epoch=3)
    from journal.services import NewEvent
    from tests.helpers import journal_by_hand

    journal_by_hand(run, NewEvent("step_started", "only", 1, {"key": "k", "kind": "tool_call"}))
    run.refresh_from_db()
    why = run_why(run)
    assert why.startswith("held by host:2:def (epoch 3) until ")
    assert "inside step 'only' (attempt 1)" in why


def test_why_a_waiting_run_says_on_what(viewer, db):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(run)
    assert run.status == "waiting"
    body = viewer.get(f"/runs/{run.id}").json()
    assert body["waiting_on"]["kind"] == "approval"
    assert body["why"] == "waiting on the approval of step 'review'"


def test_a_page_of_runs_costs_the_same_queries_for_1_or_20_runs(viewer, workflow):
    make_run(workflow=workflow)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        viewer.get("/runs")
    for _ in range(19):
        make_run(workflow=workflow)
    RunLock.objects.filter(run__in=Run.objects.all()[:5]).delete()  # some without a lease
    with CaptureQueriesContext(connection) as twenty:
        assert len(viewer.get("/runs").json()["items"]) == 20
    assert len(twenty) <= len(one)  # the first call also noted when the token was last used
    assert not any("COUNT(" in q["sql"].upper() for q in twenty.captured_queries)

"""GET /runs/{id}'s read path (issue 15 section 1): the run, its lease and its last journal row in one read, the token
and its user's permissions in one read, and the answer rendered without a second validation: the same JSON, byte
for byte, as ninja makes of the validated RunOut, in every state a run can be in."""

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from journal.services import NewEvent
from pal.api import api as ninja_api
from runs import selectors
from runs.api.runs import run_out
from runs.api.schemas import RunOut
from runs.explain import run_why
from runs.models import Run, RunLock, RunStatus
from tests.helpers import drive, drive_to_end, echo_step, expire_lease, journal_by_hand, make_run, tool_step
from tokens.models import ApiToken

from .conftest import Api, assert_error, make_user, token_for


@pytest.fixture
def viewer(db):
    return Api(token_for(make_user("rhea", "runs.view_run")))


def _validated_bytes(run: Run) -> bytes:
    """What ninja answers for the run when it validates run_out's dict against RunOut first (the path before)."""
    orm = Run.objects.select_related("workflow", "lock").get(id=run.id)
    dumped = RunOut.model_validate(run_out(orm)).model_dump()
    request = RequestFactory().get("/")
    return ninja_api.create_response(request, dumped, status=200).content


def _states() -> dict[str, Run]:
    """One run in each state GET /runs/{id} words differently."""
    runs = {}
    runs["queued, booked"] = make_run(input={"text": "naïve ✓", "n": 1.5, "deep": {"list": [1, None, "x"]}})

    held = make_run()
    Run.objects.filter(id=held.id).update(status=RunStatus.RUNNING, started_at=timezone.now())
    RunLock.objects.filter(run_id=held.id).update(owner="host:2:def", epoch=3)
    journal_by_hand(held, NewEvent("step_started", "only", 1, {"key": "k", "kind": "tool_call"}))
    runs["running, held inside a step"] = held

    backing = make_run()
    journal_by_hand(backing, NewEvent("run_backoff", "only", 1, {"until": "2031-01-02T03:04:05+00:00"}))
    runs["queued, backing off"] = backing

    expired = make_run()
    expire_lease(expired)
    runs["queued, booking expired"] = expired

    lost = make_run()
    RunLock.objects.filter(run_id=lost.id).delete()
    runs["queued, no lease"] = lost

    waiting = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(waiting)
    runs["waiting on an approval"] = waiting

    done = make_run(steps=[echo_step("only", said="hello")])
    drive_to_end(done)
    runs["succeeded"] = done

    failed = make_run(steps=[tool_step("boom", "test_fail")])
    drive_to_end(failed)
    runs["failed"] = failed
    return runs


def test_a_runs_answer_is_byte_for_byte_what_ninja_makes_of_the_validated_run_in_every_state(viewer):
    runs = _states()
    statuses = {Run.objects.get(id=run.id).status for run in runs.values()}
    assert statuses == {"queued", "running", "waiting", "succeeded", "failed"}
    for state, run in runs.items():
        response = viewer.get(f"/runs/{run.id}")
        assert response.status_code == 200, (state, response.content)
        assert response["Content-Type"] == "application/json; charset=utf-8"
        assert response.content == _validated_bytes(run), state


def test_the_last_journal_row_read_with_the_run_gives_the_same_why_as_reading_it_alone(viewer):
    runs = _states()
    for state, run in runs.items():
        read = selectors.run_with_lease(run_id=run.id)
        orm = Run.objects.select_related("workflow", "lock").get(id=run.id)
        assert run_why(read, lease=selectors.lease_of(read), last=read.last_event) == run_why(orm), state
    held = selectors.run_with_lease(run_id=runs["running, held inside a step"].id)
    assert held.last_event.kind == "step_started" and held.last_event.step_id == "only"
    assert "inside step 'only' (attempt 1)" in run_why(held, lease=selectors.lease_of(held), last=held.last_event)


def test_the_journal_row_comes_along_only_when_why_reads_it(viewer, django_assert_num_queries):
    done = make_run(steps=[echo_step("only", said="hello")])
    drive_to_end(done)
    waiting = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(waiting)
    for run in (done, waiting):
        with django_assert_num_queries(1):
            read = selectors.run_with_lease(run_id=run.id)
        assert read.last_event is None  # an ended or waiting run's why reads no journal row
    backing = make_run()
    journal_by_hand(backing, NewEvent("run_backoff", "only", 1, {"until": "2031-01-02T03:04:05+00:00"}))
    read = selectors.run_with_lease(run_id=backing.id)
    assert read.last_event.kind == "run_backoff" and read.last_event.payload["until"].startswith("2031-01-02")
    assert "due 2031-01-02T03:04:05" in viewer.get(f"/runs/{backing.id}").json()["why"]


def test_a_viewer_reads_a_run_in_one_statement_with_the_token_and_an_operator_without_the_view_permission_too(
    db, django_assert_num_queries
):
    run = make_run()
    for user in (make_user("vic2", "runs.view_run"), make_user("ops2", "runs.operate")):
        client = Api(token_for(user))
        client.get(f"/runs/{run.id}")  # the token's first use notes last_used_at (once a minute)
        with django_assert_num_queries(1):
            response = client.get(f"/runs/{run.id}")
        assert response.status_code == 200 and response.json()["id"] == str(run.id)


def test_the_run_read_with_the_token_answers_every_refusal_and_absence_as_before(db):
    run = make_run()
    viewer = Api(token_for(make_user("vela", "runs.view_run")))
    assert viewer.get(f"/runs/{run.id}").json()["id"] == str(run.id)
    assert_error(viewer.get("/runs/6f1c1f5e-0000-4000-8000-000000000000"), 404, "run_not_found")
    assert_error(viewer.get("/runs/not-a-run-id"), 422, "validation_error")
    assert_error(Api(None).get(f"/runs/{run.id}"), 401, "not_authenticated")
    assert_error(Api("pal_" + "y" * 43).get("/runs/not-a-run-id"), 401, "not_authenticated")  # the token first
    assert_error(Api(token_for(make_user("nell"))).get(f"/runs/{run.id}"), 403, "forbidden")
    ApiToken.objects.filter(user__username="vela").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(viewer.get(f"/runs/{run.id}"), 401, "not_authenticated")


def test_a_runs_read_leaves_its_workflows_definition_unread_until_something_asks_for_it(db, django_assert_num_queries):
    run = make_run(steps=[echo_step("only", said="hello")])
    read = selectors.run_with_lease(run_id=run.id)
    assert {"definition", "description"} <= read.workflow.get_deferred_fields()
    assert (read.workflow.name, read.workflow.version) == (run.workflow.name, run.workflow.version)
    with django_assert_num_queries(1):  # read when asked for, as QuerySet.defer leaves a field
        assert read.workflow.definition == run.workflow.definition


def test_a_token_whose_user_lacks_the_role_is_still_refused_and_an_unknown_run_is_404(db):
    run = make_run()
    nobody = Api(token_for(make_user("nemo")))
    refused = nobody.get(f"/runs/{run.id}")
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    viewer = Api(token_for(make_user("vee", "runs.view_run")))
    missing = viewer.get("/runs/6f1c1f5e-0000-4000-8000-000000000000")
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    assert Api("pal_" + "x" * 43).get(f"/runs/{run.id}").status_code == 401


def test_a_permission_taken_away_is_refused_at_the_next_call(db):
    from django.contrib.auth.models import Permission

    run = make_run()
    user = make_user("tom", "runs.view_run")
    client = Api(token_for(user))
    assert client.get(f"/runs/{run.id}").status_code == 200
    user.user_permissions.remove(Permission.objects.get(codename="view_run", content_type__app_label="runs"))
    assert client.get(f"/runs/{run.id}").status_code == 403


def test_the_answer_holds_no_secret_of_the_token(viewer):
    run = make_run()
    body = viewer.get(f"/runs/{run.id}").content.decode()
    assert viewer.token not in body and "token_hash" not in body and "permissions_found" not in body

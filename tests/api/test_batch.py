"""POST /runs/batch (CONTRACT section 6): up to 500 runs in one transaction, all or nothing, a bad item named by
its index, one broker send per run once the transaction commits, an idempotency key per run."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from journal.models import JournalEvent
from runs.models import Run, RunLock, RunStatus
from tests.api.conftest import assert_error
from tests.helpers import drive_to_end, echo_step, make_workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def workflow(db):
    return make_workflow(steps=[echo_step("only", said="{{ input.n }}")])


def batch(workflow, count: int, **extra) -> dict:
    return {"runs": [{"workflow": workflow.name, "input": {"n": n}, **extra} for n in range(count)]}


def test_a_batch_creates_every_run_queued_in_order_each_with_its_run_created(operator, workflow):
    answer = operator.post("/runs/batch", batch(workflow, 3))

    assert answer.status_code == 201, answer.content
    items = answer.json()["items"]
    assert [item["input"] for item in items] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {item["status"] for item in items} == {"queued"}
    for item in items:
        events = list(JournalEvent.objects.filter(run_id=item["id"]).values_list("kind", flat=True))
        assert events == ["run_created"]
        assert RunLock.objects.get(run_id=item["id"]).owner.startswith("task:")  # booked for its first task


def test_each_run_of_a_batch_is_sent_to_the_broker_once_after_the_commit(
    operator, workflow, redis_broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        answer = operator.post("/runs/batch", batch(workflow, 4))
        assert redis_broker.llen("celery") == 0  # nothing leaves before the commit

    sent = [json.loads(message) for message in redis_broker.lrange("celery", 0, -1)]
    assert sorted(m["headers"]["argsrepr"] for m in sent) == sorted(repr((i["id"],)) for i in answer.json()["items"])
    assert {m["headers"]["task"] for m in sent} == {"runs.tasks.drive"}


def test_batch_runs_are_driven_like_any_run(operator, workflow):
    items = operator.post("/runs/batch", batch(workflow, 2)).json()["items"]

    for item in items:
        run = Run.objects.get(id=item["id"])
        drive_to_end(run)
        assert run.status == RunStatus.SUCCEEDED and run.output == {"said": item["input"]["n"]}


def test_a_bad_item_refuses_the_whole_batch_naming_its_index(operator, workflow):
    body = batch(workflow, 3)
    body["runs"][2]["workflow"] = "no-such-workflow"

    error = assert_error(operator.post("/runs/batch", body), 422)

    assert "runs[2].workflow" in error["detail"] and "no-such-workflow" in error["detail"]
    assert not Run.objects.exists()


def test_an_item_with_an_input_that_is_not_an_object_is_named_by_its_index(operator, workflow):
    body = batch(workflow, 2)
    body["runs"][1]["input"] = [1, 2]

    error = assert_error(operator.post("/runs/batch", body), 422)

    assert "runs[1].input" in error["detail"]
    assert not Run.objects.exists()


def test_more_than_500_runs_or_none_are_refused(operator, workflow):
    assert "runs" in assert_error(operator.post("/runs/batch", batch(workflow, 501)), 422)["detail"]
    assert_error(operator.post("/runs/batch", {"runs": []}), 422)
    assert not Run.objects.exists()


def test_the_same_keys_again_give_the_same_runs(operator, workflow):
    body = {"runs": [{"workflow": workflow.name, "input": {"n": n}, "idempotency_key": f"k{n}"} for n in range(3)]}

    first = operator.post("/runs/batch", body).json()["items"]
    again = operator.post("/runs/batch", body)

    assert again.status_code == 201
    assert [i["id"] for i in again.json()["items"]] == [i["id"] for i in first]
    assert Run.objects.count() == 3


def test_a_known_key_with_another_body_refuses_the_batch_naming_the_index(operator, workflow):
    operator.post("/runs/batch", {"runs": [{"workflow": workflow.name, "input": {"n": 1}, "idempotency_key": "k"}]})
    body = batch(workflow, 2)
    body["runs"][1].update(idempotency_key="k", input={"n": 99})

    error = assert_error(operator.post("/runs/batch", body), 409, "idempotency_conflict")

    assert "runs[1]" in error["detail"]
    assert Run.objects.count() == 1


def test_one_key_twice_in_a_batch_is_refused(operator, workflow):
    body = batch(workflow, 2, idempotency_key="same")

    error = assert_error(operator.post("/runs/batch", body), 422, "duplicate_key")

    assert "runs[1].idempotency_key" in error["detail"] and "runs[0]" in error["detail"]


def test_keys_are_per_user_as_for_post_runs(operator, superuser, workflow):
    body = {"runs": [{"workflow": workflow.name, "input": {"n": 1}, "idempotency_key": "shared"}]}

    mine = operator.post("/runs/batch", body).json()["items"][0]["id"]
    theirs = superuser.post("/runs/batch", body).json()["items"][0]["id"]

    assert mine != theirs


def test_a_batch_needs_an_operator(viewer, workflow):
    assert_error(viewer.post("/runs/batch", batch(workflow, 1)), 403)
    assert not Run.objects.exists()


def test_the_queries_of_a_batch_grow_with_its_runs_not_faster(operator, workflow):
    def queries_for(count: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert operator.post("/runs/batch", batch(workflow, count)).status_code == 201
        return len(queries)

    few, many = queries_for(10), queries_for(100)

    assert many <= 10 * few, (few, many)  # a fixed number per run: no read that grows with the batch per run

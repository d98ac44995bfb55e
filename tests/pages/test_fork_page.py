"""The fork page, /runs/<id>/fork/: choose the step, optionally edit the input as JSON, give a reason; preview what
is reused and what runs; fork, and land on the new run's page."""

import json

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from tests.helpers import calls, drive_to_end, make_run, tool_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished(db):
    run = make_run(
        steps=[
            tool_step("fetch", "test_count", {"q": "{{ input.q }}"}),
            tool_step("summarise", "test_count", {"from": "{{ steps.fetch.output.q }}"}),
            tool_step("publish", "test_count", {"final": True}),
        ],
        input={"q": "cats"},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    return run


def url(run) -> str:
    return f"/runs/{run.id}/fork/"


def test_the_form_lists_the_steps_and_holds_the_original_input(operator, finished):
    page = operator.get(url(finished)).content.decode()

    for step in ("fetch", "summarise", "publish"):
        assert f'value="{step}"' in page
    assert "&quot;q&quot;: &quot;cats&quot;" in page  # the input, as JSON in the textarea
    assert 'value="fork"' not in page  # no fork button before a preview


def test_the_run_page_links_to_the_fork_page(operator, finished):
    assert url(finished) in operator.get(f"/runs/{finished.id}/").content.decode()


def test_a_preview_shows_what_is_reused_and_what_runs_and_creates_nothing(operator, finished):
    answer = operator.post(url(finished), {"from_step": "summarise", "input": '{"q": "dogs"}', "action": "preview"})

    assert answer.status_code == 200
    page = answer.content.decode()
    assert page.count('class="fork-reused"') == 1 and page.count('class="fork-rerun"') == 2
    assert "Reads changed input" in page and "<code>q</code>" in page
    assert "reusing is your choice" in page
    assert 'value="fork"' in page
    assert Run.objects.count() == 1


def test_forking_makes_the_run_and_opens_its_page(operator, finished):
    answer = operator.post(
        url(finished), {"from_step": "publish", "input": '{"q": "cats"}', "reason": "republish", "action": "fork"}
    )

    fork = Run.objects.get(forked_from=finished)
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{fork.id}/"
    drive_to_end(fork)
    assert fork.status == RunStatus.SUCCEEDED
    assert [c["step_id"] for c in calls(fork)] == ["publish"]  # fetch and summarise were reused, not called
    forked = JournalEvent.objects.get(run_id=finished.id, kind="run_forked")
    assert forked.payload["who"] == "otto" and forked.payload["why"] == "republish"
    assert f"/runs/{finished.id}/" in operator.get(f"/runs/{fork.id}/").content.decode()  # "forked from"
    assert "by the fork (no call)" in operator.get(f"/runs/{fork.id}/").content.decode()  # its waterfall
    receipt = operator.get(f"/runs/{fork.id}/receipt/")
    assert receipt.status_code == 200
    assert receipt.content.decode().count(f'data-reused-from="{finished.id}"') == 2  # fetch and summarise


def test_input_that_is_not_json_is_refused_by_field_and_nothing_is_made(operator, finished):
    answer = operator.post(url(finished), {"from_step": "fetch", "input": "{q: dogs", "action": "preview"})

    assert answer.status_code == 422
    assert "input: not valid JSON" in answer.content.decode()
    answer = operator.post(url(finished), {"from_step": "fetch", "input": json.dumps([1]), "action": "fork"})
    assert answer.status_code == 422 and "must be a JSON object" in answer.content.decode()
    assert Run.objects.count() == 1


def test_a_fork_without_a_reason_is_refused_naming_the_field(operator, finished):
    answer = operator.post(url(finished), {"from_step": "fetch", "input": "", "reason": " ", "action": "fork"})

    assert answer.status_code == 422 and "reason: a fork needs a reason" in answer.content.decode()
    assert Run.objects.count() == 1


def test_an_unknown_step_is_refused_as_a_choice(operator, finished):
    answer = operator.post(url(finished), {"from_step": "nope", "action": "preview"})

    assert answer.status_code == 422 and "from step:" in answer.content.decode()


def test_a_viewer_sees_the_page_but_cannot_fork(viewer, finished):
    page = viewer.get(url(finished)).content.decode()
    assert "needs the operator permission" in page and '<form method="post" action="/runs/' not in page

    answer = viewer.post(url(finished), {"from_step": "fetch", "reason": "x", "action": "fork"})
    assert answer.status_code == 403
    assert Run.objects.count() == 1


def test_the_page_needs_a_login(anonymous, finished):
    answer = anonymous.get(url(finished))
    assert answer.status_code == 302 and "/login" in answer["Location"]


def test_a_fork_of_another_step_than_the_one_previewed_shows_its_preview_first(operator, finished):
    answer = operator.post(
        url(finished), {"from_step": "fetch", "previewed": "publish", "reason": "x", "input": "", "action": "fork"}
    )

    assert answer.status_code == 200 and "What a fork from fetch would do" in answer.content.decode()
    assert Run.objects.count() == 1

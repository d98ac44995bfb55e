"""The move page, /runs/<id>/move/ (issue 27, section 2): pick a version, see what carries over and what runs again
(a GET that works without JavaScript; htmx swaps the preview alone), give a reason, move, land on the run page.
And the runs page's bulk "move to version N" over runs of one workflow."""

import json

import pytest

from runs.models import BulkAction, BulkStatus, Run, RunStatus, Workflow
from runs.services import bulk_apply, workflow_create
from tests.helpers import drive, echo_step, events, make_run, tool_step

from .conftest import htmx

pytestmark = pytest.mark.django_db

DRAFT = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
REVIEW = {"id": "review", "kind": "approval", "prompt": "Ship it?"}


def parked_run(name: str = "reply") -> Run:
    """A run of `name` v1 parked on its approval; v2 changes draft's input and adds a step."""
    workflow_create(definition={"name": name, "steps": [DRAFT, REVIEW]})
    changed = {**DRAFT, "args": {"to": "{{ input.to }}", "tone": "warm"}}
    workflow_create(definition={"name": name, "steps": [changed, REVIEW, echo_step("follow")]})
    run = make_run(workflow=Workflow.objects.get(name=name, version=1), input={"to": "ada"})
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


@pytest.fixture
def parked(db) -> Run:
    return parked_run()


def url(run) -> str:
    return f"/runs/{run.id}/move/"


def test_the_run_page_links_to_the_move_page(operator, parked):
    assert f'href="{url(parked)}"' in operator.get(f"/runs/{parked.id}/").content.decode()


def test_the_page_lists_the_other_versions_and_shows_no_preview_before_a_choice(operator, parked):
    page = operator.get(url(parked)).content.decode()
    assert '<option value="2">v2' in page and '<option value="1">' not in page
    assert "Choose a version to see what a move there would do." in page and 'id="move-form"' not in page


def test_a_get_with_a_version_renders_the_preview_without_javascript(viewer, parked):
    page = viewer.get(url(parked), {"version": 2}).content.decode()

    assert "What a move from v1 to v2 would do" in page
    assert "1 carried over · 1 run again · 1 new" in page
    assert "its input as the new version renders it differs from the journaled one" in page
    assert f"{parked.id}:draft:2" not in page  # draft is no deliver step: it claims nothing
    assert "Moving it needs the operator permission" in page  # a viewer reads; the form is an operator's


def test_htmx_asks_for_the_preview_alone(operator, parked):
    answer = operator.get(url(parked), {"version": 2}, headers=htmx("move-preview"))
    fragment = answer.content.decode()
    assert answer.status_code == 200 and fragment.startswith('<div id="move-preview"')
    assert 'id="move-form"' in fragment and 'name="version" value="2"' in fragment and "<html" not in fragment


def test_a_refused_preview_says_why_on_the_page(operator, parked):
    page = operator.get(url(parked), {"version": 7}).content.decode()
    assert "has no version 7 (version_not_found)" in page and 'id="move-form"' not in page


def test_moving_journals_who_and_why_and_opens_the_run_page(operator, parked):
    answer = operator.post(url(parked), {"version": "2", "reason": "v2 warms the tone"})

    assert answer.status_code == 302 and answer["Location"] == f"/runs/{parked.id}/"
    parked.refresh_from_db()
    assert parked.workflow.version == 2
    (moved,) = [e for e in events(parked, "definition_moved") if e.step_id is None]
    assert (moved.payload["by"], moved.payload["why"], moved.payload["rerun"]) == (
        "otto",
        "v2 warms the tone",
        ["draft"],
    )
    page = operator.get(answer["Location"]).content.decode()
    assert "Moved run" in page and 'reply <span class="muted">v2</span>' in page and "definition_moved" in page
    assert 'class="wf-line line-move"' in page  # the waterfall marks the move, with who and why in its title


def test_a_move_without_a_reason_is_refused_on_the_page_and_nothing_moves(operator, parked):
    answer = operator.post(url(parked), {"version": "2", "reason": " "})
    assert answer.status_code == 400 and "a move needs a reason (reason_required)" in answer.content.decode()
    parked.refresh_from_db()
    assert parked.workflow.version == 1 and not events(parked, "definition_moved")


def test_a_move_without_a_version_is_422(operator, parked):
    assert operator.post(url(parked), {"version": "x", "reason": "r"}).status_code == 422


def test_a_viewer_cannot_move(viewer, parked):
    assert viewer.post(url(parked), {"version": "2", "reason": "r"}).status_code == 403
    assert not events(parked, "definition_moved")


# --- bulk: move to version N ------------------------------------------------------------------------


def bulk_form(**fields) -> dict:
    return {"step": "preview", "action": "move", "scope": "matching", "reason": "v2 is out", **fields}


def test_a_bulk_move_previews_the_runs_of_one_workflow_and_moves_them(operator, parked):
    other = make_run(workflow=Workflow.objects.get(name="reply", version=1), input={"to": "bob"})
    preview = operator.post("/runs/bulk/", bulk_form(workflow="reply", version="2"))

    text = preview.content.decode()
    assert preview.status_code == 200 and "Move 2 runs of reply to version 2" in text
    assert 'name="version" value="2"' in text
    started = operator.post(
        "/runs/bulk/",
        {
            "step": "start",
            "action": "move",
            "previewed": json.dumps({"workflow": "reply"}),
            "reason": "v2 is out",
            "version": "2",
        },
    )
    assert started.status_code == 302
    bulk = BulkAction.objects.get()
    assert (bulk.action, bulk.version, bulk.total) == ("move", 2, 2)
    bulk_apply(bulk_id=bulk.id)
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.failed) == (BulkStatus.DONE, 2, 0)
    for run in (parked, other):
        run.refresh_from_db()
        assert run.workflow.version == 2
        assert [e.payload["why"] for e in events(run, "definition_moved") if e.step_id is None] == ["v2 is out"]


def test_a_bulk_move_of_runs_of_two_workflows_is_refused(operator, parked):
    parked_run("digest")
    answer = operator.post("/runs/bulk/", bulk_form(version="2"))
    assert answer.status_code == 422
    assert "a move takes the runs of one workflow; these are of digest, reply" in answer.content.decode()
    assert not BulkAction.objects.exists()


def test_a_bulk_move_needs_a_version(operator, parked):
    answer = operator.post("/runs/bulk/", bulk_form(workflow="reply"))
    assert answer.status_code == 400 and "a move needs the version to move the runs to" in answer.content.decode()

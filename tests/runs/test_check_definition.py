"""`python manage.py pal_check_definition FILE.json [--runs N] [--all]` (issue 27, section 2): exit 1 naming each run
and step that would diverge from the definition, else exit 0 saying how many runs were checked; calls nothing and
stores nothing, so CI can refuse a definition that strands live runs."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import Workflow
from runs.services import approval_decide, workflow_create
from tests.helpers import calls, drive, drive_to_end, make_run, tool_step

pytestmark = pytest.mark.django_db

DRAFT = tool_step("draft", "test_count", {"to": "{{ input.to }}"})
REVIEW = {"id": "review", "kind": "approval", "prompt": "Ship it?"}


def check(tmp_path, definition, *args) -> tuple[int, str, str]:
    path = tmp_path / "definition.json"
    path.write_text(json.dumps(definition) if not isinstance(definition, str) else definition)
    out, err = StringIO(), StringIO()
    try:
        call_command("pal_check_definition", str(path), *args, stdout=out, stderr=err)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


@pytest.fixture
def waiting():
    workflow_create(definition={"name": "reply", "steps": [DRAFT, REVIEW]})
    run = make_run(workflow=Workflow.objects.get(name="reply"), input={"to": "ada"})
    drive(run)
    return run


def test_a_definition_that_changes_a_completed_steps_input_exits_1_naming_the_run_and_step(tmp_path, waiting):
    changed = {"name": "reply", "steps": [{**DRAFT, "args": {"to": "{{ input.to }}", "cc": "ops"}}, REVIEW]}

    status, out, err = check(tmp_path, changed)

    assert status == 1
    assert f"{waiting.id} reply v1: step draft (input_changed)" in out
    assert "1 of 1 runs of reply would diverge" in err
    assert Workflow.objects.filter(name="reply").count() == 1 and len(calls(waiting)) == 1  # nothing stored or called


def test_a_definition_that_drops_a_waiting_step_exits_1(tmp_path, waiting):
    status, out, _ = check(tmp_path, {"name": "reply", "steps": [DRAFT]})
    assert status == 1 and f"{waiting.id} reply v1: step review (gone)" in out


def test_a_definition_that_keeps_the_runs_exits_0_saying_how_many_were_checked(tmp_path, waiting):
    status, out, _ = check(tmp_path, {"name": "reply", "steps": [DRAFT, REVIEW, tool_step("after", "echo")]})
    assert status == 0 and "OK: 1 runs that have not ended of reply replay against" in out


def test_ended_runs_count_only_with_all(tmp_path, waiting):
    approval_decide(run_id=waiting.id, step_id="review", approved=True, by="ada")
    drive_to_end(waiting)
    changed = {"name": "reply", "steps": [{**DRAFT, "args": {"to": "someone else"}}, REVIEW]}

    assert check(tmp_path, changed)[0] == 0
    status, out, _ = check(tmp_path, changed, "--all", "--runs", "5")
    assert status == 1 and f"{waiting.id} reply v1: step draft" in out


def test_an_invalid_definition_or_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(CommandError, match="the workflow is not valid"):
        check(tmp_path, {"name": "reply", "steps": [{"id": "a", "kind": "nope"}]})
    with pytest.raises(CommandError, match=r"definition\.json"):
        check(tmp_path, "{not json")
    with pytest.raises(CommandError, match="--runs must be 1 or more"):
        check(tmp_path, {"name": "reply", "steps": [DRAFT]}, "--runs", "0")

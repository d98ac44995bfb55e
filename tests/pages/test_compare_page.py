"""The compare page (/runs/compare/?a=&b=): two runs step by step for an operator, a model's answer diffed word by
word; a form without ids; a bad id 400 and an unknown run 404, each named; reading needs a login and a viewer."""

import uuid

from runs.models import RunStatus
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, tool_step

PAGE = "/runs/compare/"


def _run(workflow, **input):
    run = make_run(workflow=workflow, input=input)
    drive_to_end(run)
    return run


def test_the_page_shows_both_runs_step_by_step_and_the_changed_words(viewer, db):
    workflow = make_workflow(
        steps=[echo_step("fixed", said="hello"), tool_step("say", "echo", {"text": "{{ input.text }}"})]
    )
    a, b = _run(workflow, text="the red fox jumps"), _run(workflow, text="the brown fox jumps")
    response = viewer.get(PAGE, {"a": str(a.id), "b": str(b.id)})
    assert response.status_code == 200
    body = response.content.decode()
    assert f'href="/runs/{a.id}/"' in body and f'href="/runs/{b.id}/"' in body
    assert 'data-step="fixed" data-same="yes"' in body
    assert 'data-step="say" data-same="no"' in body
    assert "<del>red</del><ins>brown</ins>" in body
    assert "1 step with a different output." in body
    assert f'href="/runs/{a.id}/steps/say/"' in body  # each side links to the step's detail


def test_a_step_only_one_run_has_and_a_failed_step_read_plainly(viewer, db):
    workflow = make_workflow(steps=[echo_step("one"), tool_step("risky", "test_fail")])
    other = make_workflow(steps=[echo_step("one"), echo_step("extra")])
    a, b = _run(workflow), _run(other)
    assert a.status == RunStatus.FAILED
    body = viewer.get(PAGE, {"a": str(a.id), "b": str(b.id)}).content.decode()
    assert "Different workflows: steps are matched by id." in body
    assert "not in this run's workflow" in body
    assert "test_refused" in body and "cmp-status-failed" in body


def test_without_both_ids_the_page_is_a_form(viewer, db):
    response = viewer.get(PAGE, {"a": str(uuid.uuid4())})
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="a"' in body and 'name="b"' in body and "cmp-steps" not in body


def test_a_bad_id_is_400_and_an_unknown_run_404_each_named(viewer, db):
    run = _run(make_workflow(steps=[echo_step("one")]))
    response = viewer.get(PAGE, {"a": str(run.id), "b": "not-an-id"})
    assert response.status_code == 400
    assert "b: &#x27;not-an-id&#x27; is not a run id" in response.content.decode()
    missing = uuid.uuid4()
    response = viewer.get(PAGE, {"a": str(missing), "b": str(run.id)})
    assert response.status_code == 404
    assert f"run {missing} does not exist" in response.content.decode()


def test_the_page_needs_a_login_and_a_viewer(anonymous, nobody, db):
    run = _run(make_workflow(steps=[echo_step("one")]))
    query = {"a": str(run.id), "b": str(run.id)}
    response = anonymous.get(PAGE, query)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert nobody.get(PAGE, query).status_code == 403


def test_a_configured_secret_in_an_output_never_reaches_the_page(viewer, db, settings):
    settings.PAL_WEBHOOK_SECRET = "hush-hush-0123456789"
    workflow = make_workflow(steps=[tool_step("leak", "echo", {"said": "{{ input.said }}"})])
    a, b = _run(workflow, said="key hush-hush-0123456789 here"), _run(workflow, said="nothing")
    body = viewer.get(PAGE, {"a": str(a.id), "b": str(b.id)}).content.decode()
    assert "hush-hush-0123456789" not in body and "[redacted]" in body

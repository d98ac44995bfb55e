"""The run page's step panel (/runs/<id>/steps/<step_id>/, runs.pages.step): the fragment htmx fetches when a bar
or a journal row is clicked, and the same address as a page without JavaScript. Runs are driven inline."""

import pytest

from journal.services import NewEvent
from runs.models import RunStatus
from tests.helpers import drive_to_end, echo_step, journal_by_hand, make_run, tool_step

from .conftest import htmx

pytestmark = pytest.mark.django_db

LLM = {"kind": "llm_call", "model": "gpt-4o-mini", "provider": "fake"}
SECRET = "sk-planted-provider-key-0123456789"


def body(response) -> str:
    return response.content.decode()


def panel(client, run, step_id: str, **params):
    return client.get(f"/runs/{run.id}/steps/{step_id}/", params, headers=htmx("step-panel"))


def test_a_model_call_reads_as_its_messages_then_the_answer_with_tokens_and_cost(viewer):
    messages = [
        {"role": "system", "content": "You plan launches."},
        {"role": "user", "content": "Plan {{ input.q }}"},
    ]
    run = make_run(steps=[{"id": "plan", **LLM, "messages": messages}], input={"q": "the launch"})
    drive_to_end(run)
    tokens = run.output["usage"]["prompt_tokens"] + run.output["usage"]["completion_tokens"]

    response = panel(viewer, run, "plan")

    assert response.status_code == 200
    text = body(response)
    assert text.startswith('<section id="step-panel"') and "<html" not in text  # the fragment only
    system, user, answer = (text.index(s) for s in ("You plan launches.", "Plan the launch", run.output["text"]))
    assert system < user < answer  # the conversation in order: the messages, then the answer
    assert 'class="sp-message sp-role-system"' in text and 'class="sp-message sp-role-assistant sp-answer"' in text
    assert f"{tokens} tokens" in text and "$0.0000" in text
    assert f"{run.id}:plan:1" in text  # the key
    assert f'href="/runs/{run.id}/#step-plan"' in text  # the deep link


def test_a_prompt_reads_as_the_one_user_message(viewer):
    run = make_run(steps=[{"id": "plan", **LLM, "prompt": "Plan {{ input.q }}"}], input={"q": "it"})
    drive_to_end(run)

    text = body(panel(viewer, run, "plan"))

    assert '<div class="sp-message sp-role-user"><div class="sp-role">user</div>' in text
    assert "Plan it" in text


def test_a_failed_attempt_shows_its_error_and_a_tool_its_input_and_output(viewer):
    retry = {"max_attempts": 2, "backoff_seconds": 0}
    run = make_run(steps=[tool_step("flaky", "test_fail_before", {"succeed_on": 2}, retry=retry)])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED

    text = body(panel(viewer, run, "flaky"))

    assert "attempt 1" in text and "attempt 2" in text
    assert text.count("<h4>error</h4>") == 1 and "test_refused" in text and "not yet (attempt 1)" in text
    assert text.count("<h4>input</h4>") == 2 and "&quot;test_fail_before&quot;" in text
    assert text.count("<h4>output</h4>") == 1


def test_a_big_value_shows_a_preview_and_load_all_fetches_the_whole(viewer):
    big = "x" * 20_000 + "THE-END"
    run = make_run(steps=[tool_step("big", "echo", {"text": big})])
    drive_to_end(run)

    text = body(panel(viewer, run, "big"))

    assert "THE-END" not in text
    assert "load all (" in text
    link = f"/runs/{run.id}/steps/big/?full=output&amp;attempt=1"
    assert f'hx-get="{link}"' in text
    whole = body(panel(viewer, run, "big", full="output", attempt="1"))
    assert whole.startswith('<div class="sp-value"><pre class="json sp-full">') and "THE-END" in whole
    plain = viewer.get(f"/runs/{run.id}/steps/big/", {"full": "input", "attempt": "1"})  # without JavaScript
    assert plain["Content-Type"].startswith("text/plain") and "THE-END" in body(plain)


def test_load_all_of_an_attempt_or_field_that_does_not_exist_is_a_404(viewer):
    run = make_run(steps=[echo_step("only")])
    drive_to_end(run)

    assert panel(viewer, run, "only", full="output", attempt="7").status_code == 404
    assert panel(viewer, run, "only", full="secrets", attempt="1").status_code == 404


def test_a_for_each_steps_panel_lists_its_items_and_folds_past_twenty(viewer):
    run = make_run(
        steps=[tool_step("read", "echo", {"i": "{{ index }}"}, for_each="{{ input.items }}")],
        input={"items": list(range(30))},
    )
    drive_to_end(run)

    text = body(panel(viewer, run, "read"))

    assert "30 items" in text
    assert text.count('<article class="sp-attempt"') == 20
    assert "11 more completed attempts" in text
    assert f'href="/runs/{run.id}/steps/read%5B29%5D/"' in text  # a folded item opens its own panel


def test_an_items_panel_opens_by_its_id(viewer):
    run = make_run(
        steps=[tool_step("read", "echo", {"v": "{{ item }}"}, for_each="{{ input.items }}")],
        input={"items": ["alpha", "beta"]},
    )
    drive_to_end(run)

    text = body(panel(viewer, run, "read[1]"))

    assert "item 1 · attempt 1" in text and "beta" in text and "alpha" not in text


def test_an_unknown_step_answers_a_panel_that_names_it_with_404(viewer):
    run = make_run(steps=[echo_step("only")])

    response = panel(viewer, run, "nope")

    assert response.status_code == 404
    assert "has no step &#x27;nope&#x27;" in body(response) and 'id="step-panel"' in body(response)


def test_without_javascript_the_panel_is_a_page_of_its_own(viewer):
    run = make_run(steps=[echo_step("only", said="hello")])
    drive_to_end(run)

    response = viewer.get(f"/runs/{run.id}/steps/only/")

    text = body(response)
    assert response.status_code == 200 and "<html" in text and 'id="step-panel"' in text
    assert f'<a class="mono" href="/runs/{run.id}/">' in text  # back to the run


def test_the_run_page_loads_the_step_panels_script(viewer):
    run = make_run(steps=[echo_step("only")])

    page = body(viewer.get(f"/runs/{run.id}/"))
    assert '<script src="/static/step-panel.js" data-css="/static/step-panel.css" defer></script>' in page


def test_a_secret_value_never_shows_in_the_panel(viewer, settings):
    settings.PAL_LLM_API_KEY = SECRET
    run = make_run(steps=[{"id": "plan", **LLM, "prompt": "hi"}])
    journal_by_hand(
        run,
        NewEvent("step_started", "plan", 1, {"key": "k", "kind": "llm_call", "input": {"prompt": f"key {SECRET}"}}),
        NewEvent("step_completed", "plan", 1, {"output": {"text": f"it is {SECRET}", "model": "m"}}),
    )

    for response in (panel(viewer, run, "plan"), panel(viewer, run, "plan", full="input", attempt="1")):
        assert response.status_code == 200 and SECRET not in body(response)
        assert "[redacted]" in body(response)


def test_the_panel_needs_a_login_and_the_read_permission(anonymous, nobody):
    run = make_run(steps=[echo_step("only")])

    assert anonymous.get(f"/runs/{run.id}/steps/only/").status_code == 302
    assert nobody.get(f"/runs/{run.id}/steps/only/").status_code == 403

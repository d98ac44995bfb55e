"""Workflow definitions: validation (docs/reference/workflows.md) and templates.

Validation needs no database: the step kinds and tools are a registry in memory.
"""

import re

import pytest

from runs import workflows
from runs.steps.base import REGISTRY, StepError
from runs.workflows import WorkflowInvalid, render, validate_definition

ECHO = {"id": "a", "kind": "tool_call", "tool": "echo", "args": {}}


def definition(*steps, **top):
    return {"name": "triage", "steps": list(steps) or [dict(ECHO)], **top}


def errors_of(value) -> dict[str, list[str]]:
    """Validate and return {loc: [msg, ...]} for every error (fails if the definition is valid)."""
    with pytest.raises(WorkflowInvalid) as caught:
        validate_definition(value)
    errors: dict[str, list[str]] = {}
    for error in caught.value.errors:
        errors.setdefault(error["loc"], []).append(error["msg"])
    return errors


# --- the whole definition -------------------------------------------------------------------------


def test_a_valid_definition_is_returned_unchanged():
    value = definition(
        {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Summarise: {{ input.ticket }}"},
        {
            "id": "lookup",
            "kind": "tool_call",
            "tool": "sleep",
            "args": {"seconds": 1},
            "retry": {"max_attempts": 3, "backoff_seconds": 2},
            "timeout_seconds": 30,
        },
        {
            "id": "notify",
            "kind": "deliver",
            "channel": "webhook",
            "url": "http://127.0.0.1:9000/hook",
            "body": {"summary": "{{ steps.draft.output.text }}"},
        },
        {
            "id": "mail",
            "kind": "deliver",
            "channel": "email",
            "to": ["ops@example.com"],
            "subject": "Ticket {{ input.id }}",
            "body": "{{ steps.draft.output.text }}",
        },
        description="optional",
    )
    assert validate_definition(value) is value


def test_a_definition_that_is_not_an_object_is_refused():
    assert errors_of(["steps"]) == {"definition": ["must be a JSON object"]}


@pytest.mark.parametrize("name", ["", "Support", "support triage", "triage!", "x" * 65, 42, None])
def test_a_bad_workflow_name_is_refused(name):
    assert "name" in errors_of(definition(name=name))


def test_a_name_of_64_allowed_characters_is_accepted():
    validate_definition(definition(name="a-b_0" + "z" * 59))


def test_an_unknown_top_level_field_is_refused():
    assert errors_of(definition(colour="red")) == {"colour": ["unknown field"]}


@pytest.mark.parametrize("steps", [[], None, "draft", {"id": "a"}])
def test_steps_must_be_a_non_empty_list(steps):
    assert "steps" in errors_of({"name": "triage", "steps": steps})


def test_every_bad_field_is_reported_at_once():
    errors = errors_of(
        definition(
            {"id": "a", "kind": "tool_call", "tool": "echo", "colour": "red"},
            {"id": "b", "kind": "llm_call", "prompt": "hi"},
            name="Bad Name",
        )
    )
    assert set(errors) == {"name", "steps[0] (a).colour", "steps[1] (b).model"}


# --- step ids and kinds ---------------------------------------------------------------------------


@pytest.mark.parametrize("step_id", ["", "Draft", "two words", "x" * 65, 7, None])
def test_a_bad_step_id_is_refused_at_its_index(step_id):
    errors = errors_of(definition({**ECHO, "id": step_id}))
    assert errors["steps[0].id"] == ["must be 1-64 characters of a-z 0-9 - _"]


def test_a_step_without_an_id_is_refused_at_its_index():
    step = {k: v for k, v in ECHO.items() if k != "id"}
    assert "steps[0].id" in errors_of(definition(step))


def test_a_duplicate_step_id_is_refused_at_the_second_step():
    errors = errors_of(definition({**ECHO, "id": "a"}, {**ECHO, "id": "a"}))
    assert errors == {"steps[1] (a).id": ["duplicate step id 'a'"]}


def test_a_step_that_is_not_an_object_is_refused():
    assert errors_of(definition(dict(ECHO), "draft")) == {"steps[1]": ["must be an object"]}


def test_an_unknown_kind_is_refused_naming_it():
    errors = errors_of(definition({"id": "a", "kind": "teleport"}))
    assert errors == {"steps[0] (a).kind": ["unknown kind 'teleport'"]}


def test_a_kind_not_built_yet_is_refused_with_a_message_saying_so(monkeypatch):
    # The contract names kinds before they are all built; whichever are missing sit in NOT_YET.
    monkeypatch.setitem(workflows.NOT_YET, "teleport", "the transporter release")
    errors = errors_of(definition({"id": "later", "kind": "teleport"}))
    assert errors == {
        "steps[0] (later).kind": ["kind 'teleport' is not supported yet (it comes with the transporter release)"]
    }


@pytest.mark.parametrize(
    "kind", ["llm_call", "tool_call", "deliver", "child_run", "agent", "approval", "signal", "sleep"]
)
def test_every_kind_of_the_contract_is_either_built_or_refused_as_not_yet(kind):
    assert (kind in REGISTRY) != (kind in workflows.NOT_YET)


# --- fields per kind ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step, missing",
    [
        ({"id": "a", "kind": "llm_call", "prompt": "hi"}, "model"),
        ({"id": "a", "kind": "tool_call", "args": {}}, "tool"),
        ({"id": "a", "kind": "deliver", "body": {}}, "channel"),
        ({"id": "a", "kind": "deliver", "channel": "webhook", "url": "http://example.com/"}, "body"),
        ({"id": "a", "kind": "child_run", "input": {}}, "workflow"),
        ({"id": "a", "kind": "agent", "input": {}}, "agent"),
        ({"id": "a", "kind": "approval"}, "prompt"),
        ({"id": "a", "kind": "signal"}, "name"),
        ({"id": "a", "kind": "sleep"}, "seconds"),
    ],
)
def test_a_missing_required_field_is_refused_naming_step_and_field(step, missing):
    assert "is required" in errors_of(definition(step))[f"steps[0] (a).{missing}"]


@pytest.mark.parametrize(
    "step, field",
    [
        ({"id": "a", "kind": "tool_call", "tool": "echo", "colour": "red"}, "colour"),
        ({"id": "a", "kind": "llm_call", "model": "m", "prompt": "hi", "top_p": 1}, "top_p"),
        ({"id": "a", "kind": "deliver", "channel": "webhook", "url": "http://x/", "body": {}, "cc": []}, "cc"),
    ],
)
def test_an_unknown_field_is_refused_naming_step_and_field(step, field):
    errors = errors_of(definition(step))
    assert errors[f"steps[0] (a).{field}"] == [f"unknown field for kind '{step['kind']}'"]


def test_an_llm_call_needs_exactly_one_of_prompt_or_messages():
    neither = {"id": "a", "kind": "llm_call", "model": "m"}
    both = {**neither, "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    assert errors_of(definition(neither)) == {"steps[0] (a).prompt": ["give exactly one of prompt or messages"]}
    assert errors_of(definition(both)) == {"steps[0] (a).prompt": ["give exactly one of prompt or messages"]}


def test_an_llm_message_with_a_bad_role_is_refused_at_its_index():
    step = {
        "id": "a",
        "kind": "llm_call",
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}],
    }
    assert "steps[0] (a).messages[1]" in errors_of(definition(step))


def test_a_tool_call_to_an_unregistered_tool_is_refused():
    [message] = errors_of(definition({"id": "a", "kind": "tool_call", "tool": "teleport"}))["steps[0] (a).tool"]
    assert message.startswith("unknown tool 'teleport'; registered: ")


def test_a_webhook_with_email_fields_is_refused():
    step = {"id": "a", "kind": "deliver", "channel": "webhook", "url": "http://x/", "body": {}, "subject": "hi"}
    assert errors_of(definition(step)) == {"steps[0] (a).subject": ["is for the email channel, not webhook"]}


def test_an_email_needs_addresses_and_a_subject():
    step = {"id": "a", "kind": "deliver", "channel": "email", "to": ["nobody"], "body": "hi"}
    assert set(errors_of(definition(step))) == {"steps[0] (a).to", "steps[0] (a).subject"}


def test_an_unknown_deliver_channel_is_refused():
    step = {"id": "a", "kind": "deliver", "channel": "pigeon", "body": {}}
    assert errors_of(definition(step)) == {"steps[0] (a).channel": ["must be webhook or email"]}


# --- retry and timeout policy ---------------------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 100])
def test_max_attempts_from_1_to_100_is_accepted(attempts):
    validate_definition(definition({**ECHO, "retry": {"max_attempts": attempts, "backoff_seconds": 0}}))


@pytest.mark.parametrize("attempts", [0, 101, -1, 2.5, "3", True, None])
def test_max_attempts_out_of_bounds_or_not_whole_is_refused(attempts):
    errors = errors_of(definition({**ECHO, "retry": {"max_attempts": attempts}}))
    assert errors == {"steps[0] (a).retry.max_attempts": ["must be a whole number from 1 to 100"]}


@pytest.mark.parametrize("backoff", [-1, 86_401, "5", False])
def test_backoff_out_of_bounds_is_refused(backoff):
    errors = errors_of(definition({**ECHO, "retry": {"max_attempts": 2, "backoff_seconds": backoff}}))
    assert errors == {"steps[0] (a).retry.backoff_seconds": ["must be a number of seconds from 0 to 86400"]}


def test_an_unknown_retry_field_is_refused():
    errors = errors_of(definition({**ECHO, "retry": {"max_attempts": 2, "jitter": True}}))
    assert errors == {"steps[0] (a).retry.jitter": ["unknown field"]}


def test_a_retry_that_is_not_an_object_is_refused():
    assert "steps[0] (a).retry" in errors_of(definition({**ECHO, "retry": 3}))


@pytest.mark.parametrize("timeout", [0.5, 86_400])
def test_a_timeout_within_bounds_is_accepted(timeout):
    validate_definition(definition({**ECHO, "timeout_seconds": timeout}))


@pytest.mark.parametrize("timeout", [0, -5, 86_401, "10", True])
def test_a_timeout_out_of_bounds_is_refused(timeout):
    errors = errors_of(definition({**ECHO, "timeout_seconds": timeout}))
    assert list(errors) == ["steps[0] (a).timeout_seconds"]


# --- template references --------------------------------------------------------------------------


def echo(step_id, **args):
    return {"id": step_id, "kind": "tool_call", "tool": "echo", "args": args}


def test_templates_may_read_the_input_and_earlier_steps():
    validate_definition(
        definition(
            echo("a", x="{{ input.ticket.id }}"), echo("b", y="{{ steps.a.output.x }}", z="{{ steps.a.output }}")
        )
    )


def test_a_template_reading_an_unknown_step_is_refused_naming_step_and_field():
    errors = errors_of(definition(echo("a"), echo("b", y="{{ steps.ghost.output.x }}")))
    assert errors == {"steps[1] (b).args": ["template {{ steps.ghost.output.x }} refers to unknown step 'ghost'"]}


def test_a_template_reading_a_later_step_is_refused_naming_step_and_field():
    errors = errors_of(definition(echo("a", x="Re: {{ steps.b.output.y }}"), echo("b")))
    assert errors == {
        "steps[0] (a).args": ["template {{ steps.b.output.y }} refers to step 'b', which does not run before this one"]
    }


def test_a_template_reading_its_own_step_is_refused():
    [message] = errors_of(definition(echo("a", x="{{ steps.a.output }}")))["steps[0] (a).args"]
    assert "does not run before this one" in message


@pytest.mark.parametrize(
    "template", ["{{ env.HOME }}", "{{ steps.a.input }}", "{{ steps.a }}", "{{ input..x }}", "{{ }}"]
)
def test_a_template_that_is_not_an_input_or_step_output_path_is_refused(template):
    errors = errors_of(definition(echo("a"), echo("b", y=template)))
    assert list(errors) == ["steps[1] (b).args"]


def test_a_template_in_a_deliver_body_is_checked_too():
    step = {
        "id": "n",
        "kind": "deliver",
        "channel": "webhook",
        "url": "http://x/",
        "body": {"deep": ["{{ steps.later.output }}"]},
    }
    [message] = errors_of(definition(step, echo("later")))["steps[0] (n).body"]
    assert "does not run before this one" in message


# --- rendering ------------------------------------------------------------------------------------

CONTEXT = {
    "input": {"n": 5, "ticket": {"id": 7, "tags": ["a", "b"]}, "name": "Ada", "none": None, "ok": True},
    "steps": {"draft": {"output": {"text": "hello", "usage": {"prompt_tokens": 3}}}},
}


@pytest.mark.parametrize(
    "template, value",
    [
        ("{{ input.n }}", 5),
        ("{{input.ticket}}", {"id": 7, "tags": ["a", "b"]}),
        ("{{ input.ticket.tags }}", ["a", "b"]),
        ("{{ input.none }}", None),
        ("{{ input.ok }}", True),
        ("{{ steps.draft.output.usage.prompt_tokens }}", 3),
    ],
)
def test_a_string_that_is_exactly_one_template_keeps_the_json_type(template, value):
    assert render(template, CONTEXT) == value


def test_a_list_index_reads_one_item():
    assert render("{{ input.ticket.tags.1 }}", CONTEXT) == "b"


def test_strings_are_rendered_into_text_as_they_are():
    assert render("Hi {{ input.name }}: {{ steps.draft.output.text }}", CONTEXT) == "Hi Ada: hello"


def test_non_strings_are_rendered_into_text_as_json():
    rendered = render("n={{ input.n }} ok={{ input.ok }} none={{ input.none }} t={{ input.ticket }}", CONTEXT)
    assert rendered == 'n=5 ok=true none=null t={"id": 7, "tags": ["a", "b"]}'


def test_two_templates_in_one_string_are_text_even_without_other_characters():
    assert render("{{ input.n }}{{ input.n }}", CONTEXT) == "55"


def test_templates_inside_objects_and_lists_are_rendered():
    value = {"to": ["{{ input.name }}", "x"], "meta": {"n": "{{ input.n }}", "plain": 1}}
    assert render(value, CONTEXT) == {"to": ["Ada", "x"], "meta": {"n": 5, "plain": 1}}


def test_a_string_without_templates_is_left_alone():
    assert render("no {braces} here", CONTEXT) == "no {braces} here"


def test_a_missing_path_raises_a_step_error_naming_the_path_and_field():
    with pytest.raises(StepError) as caught:
        render({"body": "Dear {{ input.customer.name }}"}, CONTEXT, field="args")
    assert caught.value.code == "template_error"
    assert caught.value.permanent is True
    assert "input.customer" in caught.value.message
    assert "args.body" in caught.value.message


def test_a_missing_step_output_field_raises_a_step_error():
    with pytest.raises(StepError, match=re.escape("steps.draft.output.missing")):
        render("{{ steps.draft.output.missing }}", CONTEXT, field="prompt")


def test_an_index_past_the_end_of_a_list_raises_a_step_error():
    with pytest.raises(StepError, match=re.escape("input.ticket.tags.5")):
        render("{{ input.ticket.tags.5 }}", CONTEXT)

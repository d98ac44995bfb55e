"""Workflow definitions: validation (docs/reference/workflows.md) and templates.

Validation needs no database (the step kinds and tools are a registry in memory); the table of accepted
definitions at the end stores each, to show it is kept as it came.
"""

import json
import re

import pytest

from runs import workflows
from runs.errors import StepError
from runs.services import workflow_create
from runs.steps.base import REGISTRY
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


@pytest.mark.parametrize("timeout", [0, -5, 86_401, "10", True])
def test_a_timeout_out_of_bounds_is_refused(timeout):
    errors = errors_of(definition({**ECHO, "timeout_seconds": timeout}))
    assert list(errors) == ["steps[0] (a).timeout_seconds"]


# --- template references --------------------------------------------------------------------------


def echo(step_id, **args):
    return {"id": step_id, "kind": "tool_call", "tool": "echo", "args": args}


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


# --- the graph: needs, when, for_each (CONTRACT section 3) ----------------------------------------

RESEARCH = {
    "name": "research",
    "concurrency": {"key": "{{ input.customer }}", "max_runs": 2},
    "budget": {"max_cost_usd": 0.50, "max_tokens": 40000},
    "steps": [
        {"id": "plan", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Plan: {{ input.q }}"},
        {"id": "web", "kind": "tool_call", "tool": "echo", "args": {"q": "{{ input.q }}"}, "needs": ["plan"]},
        {"id": "papers", "kind": "tool_call", "tool": "echo", "args": {"q": "{{ input.q }}"}, "needs": ["plan"]},
        {
            "id": "read",
            "kind": "llm_call",
            "model": "gpt-4o-mini",
            "needs": ["web", "papers"],
            "for_each": "{{ input.sources }}",
            "max_concurrency": 4,
            "prompt": "Read {{ item }} ({{ index }})",
        },
        {
            "id": "escalate",
            "kind": "deliver",
            "channel": "webhook",
            "url": "http://127.0.0.1:9000/hook",
            "needs": ["read"],
            "when": "steps.plan.output.text != ''",
            "body": {"plan": "{{ steps.plan.output.text }}"},
        },
    ],
    "output": "{{ steps.read.output }}",
}


def test_graph_fields_are_common_fields_never_passed_to_a_kind():
    assert {"needs", "when", "for_each", "max_concurrency"} <= set(workflows.COMMON_FIELDS)


def test_a_cycle_is_refused_naming_the_steps():
    errors = errors_of(definition({**echo("a"), "needs": ["b"]}, {**echo("b"), "needs": ["a"]}))
    assert errors == {"steps[0] (a).needs": ["needs form a cycle: a needs b, b needs a"]}


def test_an_unknown_need_is_refused_naming_step_and_field():
    errors = errors_of(definition(echo("a"), {**echo("b"), "needs": ["ghost"]}))
    assert errors == {"steps[1] (b).needs": ["needs unknown step 'ghost'"]}


def test_a_template_reading_a_sibling_branch_is_refused_as_not_an_ancestor():
    errors = errors_of(
        definition(echo("a"), {**echo("b"), "needs": ["a"]}, {**echo("c", x="{{ steps.b.output }}"), "needs": ["a"]})
    )
    assert errors == {
        "steps[2] (c).args": [
            "template {{ steps.b.output }} refers to step 'b', which is not among this step's ancestors (its needs)"
        ]
    }


def test_a_step_with_empty_needs_may_not_read_the_step_before_it():
    [message] = errors_of(definition(echo("a"), {**echo("b", x="{{ steps.a.output }}"), "needs": []}))[
        "steps[1] (b).args"
    ]
    assert "is not among this step's ancestors" in message


def test_a_bad_when_is_refused_naming_step_and_field():
    errors = errors_of(definition(echo("a"), {**echo("b"), "when": "input.name|upper == 'X'"}))
    assert errors == {"steps[1] (b).when": ["filters are not allowed (|upper)"]}


def test_a_when_reading_a_step_that_is_not_an_ancestor_is_refused():
    errors = errors_of(definition(echo("a"), {**echo("b"), "needs": [], "when": "steps.a.output.ok"}))
    assert errors == {"steps[1] (b).when": ["refers to step 'a', which is not among this step's ancestors (its needs)"]}


@pytest.mark.parametrize(
    "for_each", ["input.sources", "{{ input.a }}{{ input.b }}", "all of {{ input.sources }}", ["{{ input.a }}"], 3]
)
def test_a_for_each_that_is_not_exactly_one_template_is_refused(for_each):
    errors = errors_of(definition({**echo("a"), "for_each": for_each}))
    assert errors == {
        "steps[0] (a).for_each": ['must be exactly one template that gives a list, e.g. "{{ input.sources }}"']
    }


def test_a_for_each_reading_a_step_that_is_not_an_ancestor_is_refused():
    [message] = errors_of(
        definition(echo("plan"), {**echo("read"), "needs": [], "for_each": "{{ steps.plan.output }}"})
    )["steps[1] (read).for_each"]
    assert "refers to step 'plan', which is not among this step's ancestors" in message


def test_a_for_each_cannot_read_its_own_item():
    errors = errors_of(definition({**echo("a"), "for_each": "{{ item.list }}"}))
    assert errors == {"steps[0] (a).for_each": ["is rendered before the items exist: it cannot read item or index"]}


@pytest.mark.parametrize("template", ["{{ item }}", "{{ item.a }}", "{{ index }}"])
def test_item_and_index_are_refused_outside_a_for_each_step(template):
    [message] = errors_of(definition(echo("a", x=template)))["steps[0] (a).args"]
    assert "exists only inside a for_each step" in message


def test_index_has_no_fields():
    [message] = errors_of(definition({**echo("a", x="{{ index.x }}"), "for_each": "{{ input.list }}"}))[
        "steps[0] (a).args"
    ]
    assert "index is the item's position" in message


@pytest.mark.parametrize("limit", [0, 1001, 2.5, "4", True, None])
def test_max_concurrency_out_of_bounds_is_refused(limit):
    errors = errors_of(definition({**echo("a"), "for_each": "{{ input.list }}", "max_concurrency": limit}))
    assert errors == {"steps[0] (a).max_concurrency": ["must be a whole number from 1 to 1000"]}


def test_max_concurrency_without_for_each_is_refused():
    errors = errors_of(definition({**echo("a"), "max_concurrency": 4}))
    assert errors == {
        "steps[0] (a).max_concurrency": ["is only for a for_each step (how many of its items run at once)"]
    }


# --- the workflow's options: output, concurrency, budget ------------------------------------------


def test_an_output_reading_an_unknown_step_is_refused():
    errors = errors_of(definition(echo("a"), output="{{ steps.ghost.output }}"))
    assert errors == {"output": ["template {{ steps.ghost.output }} refers to unknown step 'ghost'"]}


def test_an_output_cannot_read_item():
    assert "output" in errors_of(definition(echo("a"), output="{{ item }}"))


@pytest.mark.parametrize(
    "concurrency, loc",
    [
        ("two", "concurrency"),
        ({}, "concurrency.max_runs"),
        ({"max_runs": 0}, "concurrency.max_runs"),
        ({"max_runs": 10_001}, "concurrency.max_runs"),
        ({"max_runs": "2"}, "concurrency.max_runs"),
        ({"max_runs": 2, "key": 7}, "concurrency.key"),
        ({"max_runs": 2, "key": "{{ steps.a.output }}"}, "concurrency.key"),
        ({"max_runs": 2, "per": "minute"}, "concurrency.per"),
    ],
)
def test_a_bad_concurrency_is_refused_naming_the_field(concurrency, loc):
    assert list(errors_of(definition(concurrency=concurrency))) == [loc]


@pytest.mark.parametrize(
    "budget, loc",
    [
        ("cheap", "budget"),
        ({}, "budget"),
        ({"max_cost_usd": 0}, "budget.max_cost_usd"),
        ({"max_cost_usd": "1"}, "budget.max_cost_usd"),
        ({"max_cost_usd": float("inf")}, "budget.max_cost_usd"),
        ({"max_tokens": 0}, "budget.max_tokens"),
        ({"max_tokens": 1.5}, "budget.max_tokens"),
        ({"max_tokens": 5, "max_steps": 3}, "budget.max_steps"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_field(budget, loc):
    assert list(errors_of(definition(budget=budget))) == [loc]


# --- rendering for a graph: item and index, the run's output, for_each items -----------------------


def test_item_and_index_render_like_any_other_data():
    item_context = {**CONTEXT, "item": {"url": "https://a.example", "tags": ["x"]}, "index": 0}
    assert render("{{ item }}", item_context) == {"url": "https://a.example", "tags": ["x"]}
    assert render("{{ item.tags.0 }}", item_context) == "x"
    assert render("{{ index }}", item_context) == 0
    assert render("Read {{ item.url }} ({{ index }})", item_context) == "Read https://a.example (0)"


def test_a_missing_field_of_an_item_is_a_template_error():
    with pytest.raises(StepError) as caught:
        render("{{ item.nope }}", {**CONTEXT, "item": {}, "index": 0}, field="prompt")
    assert caught.value.code == "template_error"


def test_the_run_output_is_the_output_template_rendered():
    value = definition(echo("a"), echo("b"), output={"a": "{{ steps.a.output.n }}", "who": "{{ input.name }}"})
    context = {"input": {"name": "Ada"}, "steps": {"a": {"output": {"n": 1}}, "b": {"output": 2}}}
    assert workflows.output_of(value, context) == {"a": 1, "who": "Ada"}


def test_without_an_output_template_the_run_output_is_the_last_listed_steps():
    value = definition({**echo("a"), "needs": []}, {**echo("b"), "needs": []})
    assert workflows.output_of(value, {"input": {}, "steps": {"a": {"output": 1}, "b": {"output": 2}}}) == 2


def test_the_run_output_is_none_when_the_last_step_was_skipped_or_has_not_run():
    value = definition(echo("a"), echo("b"))
    assert workflows.output_of(value, {"input": {}, "steps": {"a": {"output": 1}, "b": {"output": None}}}) is None
    assert workflows.output_of(value, {"input": {}, "steps": {"a": {"output": 1}}}) is None


def test_for_each_items_are_the_rendered_list():
    step = {**echo("read"), "for_each": "{{ steps.plan.output.items }}"}
    context = {"input": {}, "steps": {"plan": {"output": {"items": ["a", {"b": 1}]}}}}
    assert workflows.for_each_items(step, context) == ["a", {"b": 1}]


@pytest.mark.parametrize("value, said", [({"a": 1}, "an object"), ("abc", "a string"), (None, "null"), (3, "a number")])
def test_for_each_items_that_are_not_a_list_fail_the_step_naming_it(value, said):
    with pytest.raises(StepError) as caught:
        workflows.for_each_items({**echo("read"), "for_each": "{{ input.sources }}"}, {"input": {"sources": value}})
    assert caught.value.code == "for_each_not_a_list"
    assert caught.value.message == f"for_each of step 'read' gave {said}, not a list"


def test_for_each_items_past_the_limit_fail_the_step():
    step = {**echo("read"), "for_each": "{{ input.sources }}"}
    assert len(workflows.for_each_items(step, {"input": {"sources": [0] * workflows.MAX_ITEMS}})) == 10_000
    with pytest.raises(StepError) as caught:
        workflows.for_each_items(step, {"input": {"sources": [0] * (workflows.MAX_ITEMS + 1)}})
    assert caught.value.code == "too_many_items"
    assert "'read'" in caught.value.message


def test_for_each_items_reading_missing_data_is_a_template_error_naming_the_step():
    with pytest.raises(StepError) as caught:
        workflows.for_each_items({**echo("read"), "for_each": "{{ input.sources }}"}, {"input": {}})
    assert caught.value.code == "template_error"
    assert "for_each of step 'read'" in caught.value.message


def test_a_kind_that_is_not_a_string_is_refused_not_a_crash():
    assert errors_of(definition({"id": "a", "kind": ["tool_call"]})) == {
        "steps[0] (a).kind": ["unknown kind ['tool_call']"]
    }


# --- what is accepted: stored as it came ----------------------------------------------------------

ACCEPTED = {
    "a name of 64 allowed characters": definition(name="a-b_0" + "z" * 59),
    "max_attempts 1": definition({**ECHO, "retry": {"max_attempts": 1, "backoff_seconds": 0}}),
    "max_attempts 100": definition({**ECHO, "retry": {"max_attempts": 100, "backoff_seconds": 0}}),
    "a timeout of 0.5 s": definition({**ECHO, "timeout_seconds": 0.5}),
    "a timeout of a day": definition({**ECHO, "timeout_seconds": 86_400}),
    "the contract's research example": RESEARCH,
    "templates reading the input and earlier steps": definition(
        echo("a", x="{{ input.ticket.id }}"), echo("b", y="{{ steps.a.output.x }}", z="{{ steps.a.output }}")
    ),
    "a template reading an ancestor however far": definition(
        echo("a"),
        {**echo("b"), "needs": ["a"]},
        {**echo("c"), "needs": []},
        {**echo("d", x="{{ steps.a.output }}", y="{{ steps.c.output }}"), "needs": ["b", "c"]},
    ),
    "a template reading an ancestor listed after it": definition(
        {**echo("a", x="{{ steps.b.output }}"), "needs": ["b"]}, {**echo("b"), "needs": []}
    ),
    "a when over ancestors and input": definition(
        echo("triage"), {**echo("b"), "when": 'steps.triage.output.x == "high" and input.vip'}
    ),
    "a for_each reading an ancestor's output": definition(
        echo("plan"), {**echo("read", x="{{ item }}"), "for_each": "{{ steps.plan.output.items }}"}
    ),
    **{
        f"{template} inside a for_each step": definition({**echo("a", x=template), "for_each": "{{ input.list }}"})
        for template in ("{{ item }}", "{{ item.a.b }}", "{{ item.0 }}", "{{ index }}", "n{{ index }}")
    },
    "max_concurrency 1": definition({**echo("a"), "for_each": "{{ input.list }}", "max_concurrency": 1}),
    "max_concurrency 1000": definition({**echo("a"), "for_each": "{{ input.list }}", "max_concurrency": 1000}),
    "an output reading any step, any JSON shape": definition(
        echo("a"), echo("b"), output={"first": "{{ steps.a.output }}", "all": ["{{ steps.b.output.x }}", 1]}
    ),
    "a concurrency of one group": definition(concurrency={"max_runs": 1}),
    "a concurrency keyed by the input": definition(concurrency={"key": "{{ input.customer }}", "max_runs": 10_000}),
    "a concurrency keyed by text and input": definition(concurrency={"key": "c-{{ input.id }}", "max_runs": 3}),
    "a budget in dollars": definition(budget={"max_cost_usd": 0.5}),
    "a budget in tokens": definition(budget={"max_tokens": 40_000}),
    "a budget in both": definition(budget={"max_cost_usd": 2, "max_tokens": 1}),
}


@pytest.mark.django_db
@pytest.mark.parametrize("value", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_valid_definition_is_stored_as_it_came(value):
    sent = json.loads(json.dumps(value))  # what a client sent, kept aside from what validation is handed
    assert validate_definition(value) == sent
    stored = workflow_create(definition=value)
    stored.refresh_from_db()
    assert (stored.name, stored.version, stored.definition) == (sent["name"], 1, sent)

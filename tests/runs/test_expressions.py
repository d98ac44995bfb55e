"""runs.expressions: a step's `when`, checked when posted and evaluated in Jinja2's sandbox. No database."""

import pytest

from runs.errors import StepError
from runs.expressions import MAX_LENGTH, when_problems, when_true

CONTRACT_EXAMPLE = 'steps.triage.output.severity == "high" and input.vip'


def context(input=None, **outputs):
    return {"input": input or {}, "steps": {step_id: {"output": output} for step_id, output in outputs.items()}}


# --- checked when the workflow is posted ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        CONTRACT_EXAMPLE,
        "input.vip",
        "not input.vip",
        "input.n >= 3 or input.n < -1",
        'input.region in ["eu", "us"]',
        'input.region not in ("eu", "us")',
        "steps.triage.output.tags.0 == 'a'",
        'steps["triage"]["output"]["severity"] != none',
        "input.tags[-1] == true",
        "1 < input.n < 10",
    ],
)
def test_comparisons_boolean_operators_literals_and_data_are_allowed(text):
    assert when_problems(text, ancestors={"triage"}) == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("input.__class__", "attribute '__class__' is not data"),
        ("input._secret", "attribute '_secret' is not data"),
        ("input.a()", "calls are not allowed"),
        ("input.items()", "calls are not allowed"),
        ('"x"|upper', "filters are not allowed (|upper)"),
        ("range(10)", "calls are not allowed"),
        ("input.n is defined", "tests are not allowed (is defined)"),
        ("cycler", "unknown name 'cycler'"),
        ("lipsum", "unknown name 'lipsum'"),
        ("input.n + 1 > 2", "Add is not allowed"),
        ("input.a ~ input.b", "Concat is not allowed"),
        ("1 if input.vip else 0", "CondExpr is not allowed"),
        ('{"a": 1}', "Dict is not allowed"),
    ],
)
def test_anything_beyond_comparisons_and_data_is_refused(text, problem):
    [message] = when_problems(text, ancestors=set())
    assert problem in message


def test_a_step_that_is_not_an_ancestor_is_refused_by_name():
    assert when_problems("steps.later.output.ok", ancestors={"plan"}) == [
        "refers to step 'later', which is not among this step's ancestors (its needs)"
    ]


def test_the_contract_example_is_refused_when_triage_is_not_an_ancestor():
    assert when_problems(CONTRACT_EXAMPLE, ancestors=set()) == [
        "refers to step 'triage', which is not among this step's ancestors (its needs)"
    ]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("steps", "steps must be followed by a step id and .output"),
        ("steps.plan", "steps.plan must be followed by .output"),
        ("steps.plan.input", "steps.plan must be followed by .output"),
        ("steps[input.which].output", "steps must be followed by a literal step id"),
    ],
)
def test_steps_must_be_read_as_steps_id_output(text, problem):
    [message] = when_problems(text, ancestors={"plan"})
    assert message.startswith(problem)


@pytest.mark.parametrize("name", ["item", "index"])
def test_item_and_index_are_refused_because_when_decides_for_the_whole_step(name):
    [message] = when_problems(f"{name} == 1", ancestors=set())
    assert message == f"{name} is not available: when decides once for the whole step, before its items"


@pytest.mark.parametrize("text", ["input.a ==", "input.a )", "(input.a", "input.a input.b", "=="])
def test_a_syntax_error_is_named(text):
    [message] = when_problems(text, ancestors=set())
    assert message.startswith("is not a valid expression: ")


def test_a_syntax_error_does_not_speak_of_templates():
    assert when_problems("input.a ==", ancestors=set()) == [
        "is not a valid expression: unexpected 'end of the expression'"
    ]


def test_an_attempt_to_close_the_expression_and_open_a_template_is_a_syntax_error():
    [message] = when_problems("input.a ) }}{% for x in y %}{{ (1", ancestors=set())
    assert message.startswith("is not a valid expression")


def test_a_template_written_in_place_of_an_expression_says_how_to_write_it():
    assert when_problems("{{ input.vip }}", ancestors=set()) == [
        "is an expression, not a template: write it without {{ }}, e.g. input.vip"
    ]


@pytest.mark.parametrize("text", ["", "   ", None, 3, ["input.vip"]])
def test_a_when_that_is_not_a_non_empty_string_is_refused(text):
    [message] = when_problems(text, ancestors=set())
    assert message.startswith("must be a non-empty expression string")


def test_a_very_long_expression_is_refused():
    [message] = when_problems("input.a == 1 or " * 200 + "true", ancestors=set())
    assert message.endswith(f"at most {MAX_LENGTH}")


def test_every_distinct_problem_is_reported_once():
    problems = when_problems("steps.a.output.x and steps.a.output.y and env.HOME", ancestors=set())
    assert problems == [
        "refers to step 'a', which is not among this step's ancestors (its needs)",
        "unknown name 'env': an expression reads only input and steps",
    ]


# --- evaluated when the step is reached -----------------------------------------------------------


def test_the_contract_example_is_true_for_a_high_severity_vip():
    assert when_true(CONTRACT_EXAMPLE, context({"vip": True}, triage={"severity": "high"})) == (True, True)


def test_the_contract_example_is_false_for_a_low_severity_and_says_so():
    assert when_true(CONTRACT_EXAMPLE, context({"vip": True}, triage={"severity": "low"})) == (False, False)


def test_the_raw_value_is_returned_beside_its_truthiness():
    assert when_true("input.vip and input.n", context({"vip": True, "n": 0})) == (False, 0)
    assert when_true("input.tags", context({"tags": ["a"]})) == (True, ["a"])


def test_a_tuple_literal_comes_back_as_a_json_list():
    assert when_true("(1, 2)", context()) == (True, [1, 2])


@pytest.mark.parametrize(
    "text, value",
    [
        ("input.missing", None),
        ("input.missing.deeper.still", None),
        ("steps.ghost.output.x", None),
        ("steps.skipped.output.text", None),
        ("input.tags.5", None),
        ("input.missing > 3", None),
        ("input.missing == 'x'", False),
        ("'x' in input.missing", False),
    ],
)
def test_missing_data_reads_as_undefined_and_is_false_never_an_error(text, value):
    assert when_true(text, context({"tags": ["a"]}, skipped=None)) == (False, value)


def test_a_skipped_step_compared_with_not_equal_is_true():
    # The contract's escalate step: a skipped plan has output null, so its text is undefined, which is not ''.
    assert when_true("steps.plan.output.text != ''", context(plan=None)) == (True, True)


def test_missing_data_is_undefined_not_null_when_the_value_itself_is_asked_for():
    assert when_true("input.missing.x", context()) == (False, None)


def test_a_key_that_is_also_a_python_method_name_reads_the_data():
    assert when_true("input.items", context({"items": [1, 2]})) == (True, [1, 2])
    assert when_true("input.keys", context({})) == (False, None)


def test_python_attributes_are_never_reachable_at_run_time():
    # Refused when posted; if such a definition got in, the data-only lookup still reads nothing.
    assert when_true("input.__class__", context({"a": 1})) == (False, None)
    assert when_true("input['__class__']", context({"a": 1})) == (False, None)


def test_a_comparison_that_python_cannot_make_is_a_when_error():
    with pytest.raises(StepError) as caught:
        when_true('input.n > "a"', context({"n": 3}))
    assert caught.value.code == "when_error"
    assert caught.value.permanent is True
    assert 'input.n > "a"' in caught.value.message


def test_an_expression_that_does_not_parse_at_run_time_is_a_when_error():
    with pytest.raises(StepError) as caught:
        when_true("input.a ==", context())
    assert caught.value.code == "when_error"


def test_the_steps_of_the_context_may_be_absent():
    assert when_true("input.vip", {"input": {"vip": True}}) == (True, True)

"""Workflow definitions: validation (docs/reference/workflows.md) and templates.

validate_definition returns the definition unchanged or raises WorkflowInvalid with one error per bad field,
each naming where it is ("steps[2].model") and what is wrong. The graph of the steps (needs) is runs.graph's,
the `when` expressions runs.expressions'.
"""

import json
import math
import re
from collections.abc import Callable, Container
from typing import Any

from .errors import StepError
from .expressions import when_problems
from .graph import Ancestry, graph_problems
from .steps.base import NAME_RE, TASK_WORKFLOW_RE, StepContext, get_kind

TEMPLATE_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
# Fields of every step that the engine reads itself: never passed to a kind's run, never template-checked as
# the kind's fields (for_each and when are checked on their own).
COMMON_FIELDS = ("id", "kind", "retry", "timeout_seconds", "needs", "when", "for_each", "max_concurrency")
TOP_LEVEL_FIELDS = ("name", "description", "steps", "output", "concurrency", "budget", "attributes")
NOT_YET: dict[str, str] = {}  # kinds named by the contract but not built yet
MAX_STEPS = 10_000
MAX_ITEMS = 10_000  # items of one for_each step
MAX_CONCURRENCY = 1_000  # a for_each step's max_concurrency
DEFAULT_MAX_CONCURRENCY = 10
MAX_CONCURRENT_RUNS = 10_000  # a workflow's concurrency.max_runs
ATTRIBUTE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # goes into a query string as attr.NAME
MAX_ATTRIBUTES = 20
MAX_APPROVAL_TIMEOUT = 31_622_400  # an approval's timeout_seconds: 366 days


class WorkflowInvalid(ValueError):
    def __init__(self, errors: list[dict]):
        self.errors = errors
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors))


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    if isinstance(value, float):
        return math.isfinite(value)  # json reads Infinity and NaN
    return isinstance(value, int) and not isinstance(value, bool)


def templates_in(value: Any):
    """Yield every template path found in the strings of value (recursively)."""
    if isinstance(value, str):
        for match in TEMPLATE_RE.finditer(value):
            yield match.group(1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from templates_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from templates_in(item)


# Says what is wrong with a template reading steps.ID (given ID), or None when this place may read it.
StepCheck = Callable[[str], str | None]


def _check_template(path: str, step_check: StepCheck, *, loop: bool = False) -> str | None:
    """What is wrong with one template path, or None. loop: inside a for_each step, where item and index are."""
    if not PATH_RE.match(path):
        return f"template {{{{ {path} }}}} is not a dotted path like input.a or steps.ID.output.a"
    parts = path.split(".")
    if parts[0] == "input":
        return None
    if parts[0] == "steps":
        if len(parts) < 3 or parts[2] != "output":
            return f"template {{{{ {path} }}}} must read steps.ID.output[.field]"
        problem = step_check(parts[1])
        return None if problem is None else f"template {{{{ {path} }}}} {problem}"
    if parts[0] in ("item", "index"):
        if not loop:
            return f"template {{{{ {path} }}}} reads {parts[0]}, which exists only inside a for_each step"
        if parts[0] == "index" and len(parts) > 1:
            return f"template {{{{ {path} }}}}: index is the item's position (from 0) and has no fields"
        return None
    if loop:
        return f"template {{{{ {path} }}}} must start with input., steps., item or index"
    return f"template {{{{ {path} }}}} must start with input. or steps."


def _ancestor_check(index: int, first_index: dict[str, int], ancestry: Ancestry) -> StepCheck:
    """A step's templates may read only its ancestors (its needs, their needs ...)."""

    def check(ref: str) -> str | None:
        if ref not in first_index:
            return f"refers to unknown step {ref!r}"
        other = first_index[ref]
        if ancestry.includes(index, other):
            return None
        if other >= index:  # the step itself, or one listed after it (a plain list says it like this)
            return f"refers to step {ref!r}, which does not run before this one"
        return f"refers to step {ref!r}, which is not among this step's ancestors (its needs)"

    return check


def _check_templates(value: Any, loc: str, step_check: StepCheck, err, *, loop: bool = False):
    for path in templates_in(value):
        problem = _check_template(path, step_check, loop=loop)
        if problem:
            err(loc, problem)


def validate_definition(definition: Any) -> dict:
    errors: list[dict] = []

    def err(loc, msg):
        errors.append({"loc": loc, "msg": msg})

    steps = _validate_top(definition, err)
    if steps is None:
        raise WorkflowInvalid(errors)
    first_index: dict[str, int] = {}
    for index, step in enumerate(steps):
        if isinstance(step, dict) and isinstance(step.get("id"), str):
            first_index.setdefault(step["id"], index)
    ancestry = Ancestry(steps)
    seen: set[str] = set()
    for index, step in enumerate(steps):
        _validate_step(
            step,
            index,
            err,
            seen=seen,
            step_check=_ancestor_check(index, first_index, ancestry),
            ancestors=ancestry.view(index),
        )
    for loc, message in graph_problems(steps):
        err(loc, message)
    _validate_options(definition, err, known=set(first_index))
    if errors:
        raise WorkflowInvalid(errors)
    return definition


def _validate_top(definition: Any, err) -> list | None:
    """The definition's own fields; its steps when there is a list of them to go through, else None."""
    if not isinstance(definition, dict):
        raise WorkflowInvalid([{"loc": "definition", "msg": "must be a JSON object"}])
    for key in definition:
        if key not in TOP_LEVEL_FIELDS:
            err(key, "unknown field")
    name = definition.get("name")
    if not isinstance(name, str) or not (NAME_RE.match(name) or TASK_WORKFLOW_RE.match(name)):
        err("name", "must be 1-64 characters of a-z 0-9 - _ (or task:<module>.<function>, a Django task's)")
    if "description" in definition and not isinstance(definition["description"], str):
        err("description", "must be a string")
    steps = definition.get("steps")
    if not isinstance(steps, list) or not steps:
        err("steps", "must be a non-empty list of steps")
        return None
    if len(steps) > MAX_STEPS:
        err("steps", f"has {len(steps)} steps; at most {MAX_STEPS}")
        return None
    return steps


def _validate_step(step: Any, index: int, err, *, seen: set[str], step_check: StepCheck, ancestors: Container[str]):
    """One step: its id, its kind's fields, its policy, its graph fields and the templates in its fields."""
    where = f"steps[{index}]"
    if not isinstance(step, dict):
        err(where, "must be an object")
        return
    step_id = step.get("id")
    if isinstance(step_id, str) and NAME_RE.match(step_id):
        where = f"steps[{index}] ({step_id})"
        if step_id in seen:
            err(f"{where}.id", f"duplicate step id {step_id!r}")
    else:
        err(f"{where}.id", "must be 1-64 characters of a-z 0-9 - _")
    _validate_kind_fields(step, where, err)
    _validate_policy(step, where, err)
    _validate_graph_fields(step, where, err, step_check, ancestors=ancestors)
    for key, value in step.items():
        if key not in COMMON_FIELDS:
            _check_templates(value, f"{where}.{key}", step_check, err, loop="for_each" in step)
    if isinstance(step_id, str):
        seen.add(step_id)


def _validate_kind_fields(step: dict, where: str, err) -> None:
    """The step's kind is one we have, and its fields are that kind's (its own validate() too)."""
    kind_name = step.get("kind")
    kind = get_kind(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        if isinstance(kind_name, str) and kind_name in NOT_YET:
            err(f"{where}.kind", f"kind {kind_name!r} is not supported yet (it comes with {NOT_YET[kind_name]})")
        else:
            err(f"{where}.kind", f"unknown kind {kind_name!r}")
        return
    allowed = set(COMMON_FIELDS) | set(kind.required) | set(kind.optional)
    for key in step:
        if key not in allowed:
            err(f"{where}.{key}", f"unknown field for kind {kind_name!r}")
    for key in kind.required:
        if key not in step:
            err(f"{where}.{key}", "is required")
    for field_name, message in kind.validate(step):
        err(f"{where}.{field_name}", message)


def _validate_graph_fields(step: dict, where: str, err, step_check: StepCheck, *, ancestors: Container[str]):
    """when, for_each and max_concurrency (needs is the graph's: graph_problems)."""
    if "when" in step:
        for message in when_problems(step["when"], ancestors=ancestors):
            err(f"{where}.when", message)
    if "for_each" in step:
        value = step["for_each"]
        whole = TEMPLATE_RE.fullmatch(value) if isinstance(value, str) else None
        if whole is None:
            err(f"{where}.for_each", 'must be exactly one template that gives a list, e.g. "{{ input.sources }}"')
        elif whole.group(1).split(".")[0] in ("item", "index"):
            err(f"{where}.for_each", "is rendered before the items exist: it cannot read item or index")
        else:
            problem = _check_template(whole.group(1), step_check)
            if problem:
                err(f"{where}.for_each", problem)
    if "max_concurrency" in step:
        limit = step["max_concurrency"]
        if "for_each" not in step:
            err(f"{where}.max_concurrency", "is only for a for_each step (how many of its items run at once)")
        elif not _is_int(limit) or not 1 <= limit <= MAX_CONCURRENCY:
            err(f"{where}.max_concurrency", f"must be a whole number from 1 to {MAX_CONCURRENCY}")


def _validate_options(definition: dict, err, *, known: set[str]):
    """The workflow's output, concurrency and budget (docs/reference/workflows.md)."""

    def any_step(ref: str) -> str | None:  # the output is rendered once the run has ended: every step has
        return None if ref in known else f"refers to unknown step {ref!r}"

    if definition.get("output") is not None:
        _check_templates(definition["output"], "output", any_step, err)
    if "concurrency" in definition:
        _validate_concurrency(definition["concurrency"], err)
    if "budget" in definition:
        _validate_budget(definition["budget"], err)
    if "attributes" in definition:
        for loc, message in attribute_problems(definition["attributes"], known=known):
            err(loc, message)


def attribute_problems(attributes: Any, *, known: Container[str] | None) -> list[tuple[str, str]]:
    """(loc, message) of each bad entry of a workflow's attributes (NAME -> template over input and steps). known:
    the step ids a template may read (None: any, a Python workflow's, whose steps are its code's calls)."""
    problems: list[tuple[str, str]] = []

    def any_known(ref: str) -> str | None:
        return None if known is None or ref in known else f"refers to unknown step {ref!r}"

    if not isinstance(attributes, dict) or not attributes:
        return [("attributes", 'must be an object of NAME: template, e.g. {"customer": "{{ input.customer }}"}')]
    if len(attributes) > MAX_ATTRIBUTES:
        problems.append(("attributes", f"has {len(attributes)} attributes; at most {MAX_ATTRIBUTES}"))
    for name, template in attributes.items():
        loc = f"attributes.{name}"
        if not ATTRIBUTE_NAME_RE.match(name):
            problems.append((loc, "a name is 1-40 characters of a-z 0-9 _, starting with a letter"))
        if not isinstance(template, str) or not TEMPLATE_RE.search(template):
            problems.append((loc, 'must be a template string, e.g. "{{ input.customer }}"'))
            continue
        _check_templates(template, loc, any_known, lambda where, message: problems.append((where, message)))
    return problems


def _validate_concurrency(concurrency: Any, err) -> None:
    def input_only(ref: str) -> str | None:
        return "reads a step, but the key is rendered when the run is created, before any step: only input"

    if not isinstance(concurrency, dict):
        err("concurrency", "must be an object with max_runs and an optional key")
        return
    for key in concurrency:
        if key not in ("key", "max_runs"):
            err(f"concurrency.{key}", "unknown field")
    if "key" in concurrency:
        if not isinstance(concurrency["key"], str) or not concurrency["key"]:
            err("concurrency.key", 'must be a template string, e.g. "{{ input.customer }}"')
        else:
            _check_templates(concurrency["key"], "concurrency.key", input_only, err)
    max_runs: Any = concurrency.get("max_runs")
    if "max_runs" not in concurrency:
        err("concurrency.max_runs", "is required")
    elif not _is_int(max_runs) or not 1 <= max_runs <= MAX_CONCURRENT_RUNS:
        err("concurrency.max_runs", f"must be a whole number from 1 to {MAX_CONCURRENT_RUNS}")


def _validate_budget(budget: Any, err) -> None:
    if not isinstance(budget, dict):
        err("budget", "must be an object with max_cost_usd and/or max_tokens")
        return
    for key in budget:
        if key not in ("max_cost_usd", "max_tokens"):
            err(f"budget.{key}", "unknown field")
    if "max_cost_usd" not in budget and "max_tokens" not in budget:
        err("budget", "give at least one of max_cost_usd or max_tokens")
    if "max_cost_usd" in budget and not (_is_number(budget["max_cost_usd"]) and budget["max_cost_usd"] > 0):
        err("budget.max_cost_usd", "must be a number of US dollars above 0")
    if "max_tokens" in budget and not (_is_int(budget["max_tokens"]) and budget["max_tokens"] > 0):
        err("budget.max_tokens", "must be a whole number of tokens above 0")


def _validate_policy(step, where, err):
    if "retry" in step:
        retry = step["retry"]
        if not isinstance(retry, dict):
            err(f"{where}.retry", "must be an object with max_attempts and backoff_seconds")
        else:
            for key in retry:
                if key not in ("max_attempts", "backoff_seconds"):
                    err(f"{where}.retry.{key}", "unknown field")
            attempts = retry.get("max_attempts", 1)
            if not _is_int(attempts) or not 1 <= attempts <= 100:
                err(f"{where}.retry.max_attempts", "must be a whole number from 1 to 100")
            backoff = retry.get("backoff_seconds", 0)
            if not _is_number(backoff) or not 0 <= backoff <= 86_400:
                err(f"{where}.retry.backoff_seconds", "must be a number of seconds from 0 to 86400")
    if "timeout_seconds" in step:
        timeout = step["timeout_seconds"]
        # An approval's is the time it waits for a person (then on_timeout decides): as long as a sleep may be.
        longest = MAX_APPROVAL_TIMEOUT if step.get("kind") == "approval" else 86_400
        if not _is_number(timeout) or not 0 < timeout <= longest:
            err(f"{where}.timeout_seconds", f"must be a number of seconds above 0 and at most {longest}")


# --- templates ------------------------------------------------------------------------------------


class _Missing(Exception):
    pass


def _lookup(path: str, context: dict):
    value: Any = context
    walked = []
    for part in path.split("."):
        walked.append(part)
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise _Missing(".".join(walked))
    return value


def render(value: Any, context: dict, *, field: str = "") -> Any:
    """Render templates in value. A string that is exactly one template takes that value with its JSON type."""
    if isinstance(value, str):
        if "{{" not in value:
            return value
        whole = TEMPLATE_RE.fullmatch(value)
        try:
            if whole:
                return _lookup(whole.group(1), context)

            def text(match):
                found = _lookup(match.group(1), context)
                return found if isinstance(found, str) else json.dumps(found)

            return TEMPLATE_RE.sub(text, value)
        except _Missing as missing:
            raise StepError(
                f"template in {field or 'a field'} reads {missing}, which does not exist", code="template_error"
            ) from None
    if isinstance(value, dict):
        return {k: render(v, context, field=f"{field}.{k}" if field else k) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context, field=f"{field}[{i}]") for i, v in enumerate(value)]
    return value


def output_of(definition: dict, context: dict) -> Any:
    """The run's output: its `output` rendered over the context ({input, steps}), else the output of the last
    listed step (None when it has none, e.g. skipped). A template that reads missing data is a StepError
    "template_error", as in a step."""
    if definition.get("output") is not None:
        return render(definition["output"], context, field="output")
    last = definition["steps"][-1]["id"]
    return ((context.get("steps") or {}).get(last) or {}).get("output")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (str, "a string"), (dict, "an object"), (int, "a number")):
        if isinstance(value, kind):
            return name
    return "a number" if isinstance(value, float) else type(value).__name__


def for_each_items(step: dict, context: dict) -> list:
    """The items of a for_each step: its template rendered over the context ({input, steps}). Not a list, or a
    list of more than MAX_ITEMS: a definite StepError naming the step."""
    items = render(step["for_each"], context, field=f"for_each of step {step['id']!r}")
    if not isinstance(items, list):
        raise StepError(
            f"for_each of step {step['id']!r} gave {_json_type(items)}, not a list", code="for_each_not_a_list"
        )
    if len(items) > MAX_ITEMS:
        raise StepError(
            f"for_each of step {step['id']!r} gave {len(items):,} items; at most {MAX_ITEMS:,}", code="too_many_items"
        )
    return items


def step_policy(step: dict) -> tuple[int, float]:
    retry = step.get("retry") or {}
    return int(retry.get("max_attempts", 1)), float(retry.get("backoff_seconds", 0))


def step_fields(step: dict, *, context: dict) -> dict:
    """A step's fields as its kind gets them: the templated ones rendered from the context ({input, steps, item,
    index}), the engine's own (needs, retry ...) left out. What a step was sent is this (journaled as its input)."""
    kind = get_kind(step["kind"])
    if kind is None:
        raise StepError(f"unknown kind {step['kind']!r}", code="unknown_kind")
    return {
        k: (render(v, context, field=k) if k in kind.templated else v)
        for k, v in step.items()
        if k not in COMMON_FIELDS
    }


def literal_fields(step: dict, item: tuple[int, Any] | None = None) -> dict:
    """A Python workflow's step's fields as its code gave them (no template is rendered); an item of its ctx.map
    gets its element as the function's one argument."""
    fields = {k: v for k, v in step.items() if k not in COMMON_FIELDS}
    if item is not None:
        fields["args"] = [item[1]]
    return fields


def step_invoke(step: dict, ctx: StepContext, *, context: dict, fields: dict | None = None) -> Any:
    """Run one step: its kind's code called with its fields (rendered here from the context unless given). The one
    way a step is invoked (by a walk, and by an operator's "send again" of a side effect)."""
    kind = get_kind(step["kind"])
    if kind is None:
        raise StepError(f"unknown kind {step['kind']!r}", code="unknown_kind")
    return kind.run(step_fields(step, context=context) if fields is None else fields, ctx)

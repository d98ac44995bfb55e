"""A step's `when`: a sandboxed expression over `input` and `steps` (docs/reference/workflows.md, "Graphs")."""

# steps.triage.output.severity == "high" and input.vip
#
# Parsed and evaluated by Jinja2's sandbox (ImmutableSandboxedEnvironment), never by eval or a parser of our
# own. On top of the sandbox, when_problems allows only a small grammar when the workflow is posted (comparisons,
# and / or / not, literals, reading the data), and the environment reads only data at run time: `a.b` and `a[b]`
# look a key up in an object or an index up in a list, never an attribute of a Python object.

from collections.abc import Container
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError, UndefinedError, nodes
from jinja2.parser import Parser
from jinja2.runtime import Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import StepError

__all__ = ["MAX_LENGTH", "when_problems", "when_true"]

MAX_LENGTH = 2_000  # characters of one expression: a condition, not a program
NAMES = ("input", "steps")
# The nodes a condition may use; anything else (a call, a filter, a test, arithmetic, ~, x if y else z) is refused.
ALLOWED = (
    nodes.Compare,
    nodes.Operand,
    nodes.And,
    nodes.Or,
    nodes.Not,
    nodes.Neg,
    nodes.Pos,
    nodes.Const,
    nodes.List,
    nodes.Tuple,
    nodes.Name,
    nodes.Getattr,
    nodes.Getitem,
)


class _DataEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, reading data only: a key of a dict, an index of a list; anything else is undefined (so
    `input.items` is the input's "items" key, never dict.items, and `input.__class__` is nothing)."""

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, dict):
            if isinstance(argument, str) and argument in obj:
                return obj[argument]
        elif isinstance(obj, (list, tuple)) and isinstance(argument, int) and not isinstance(argument, bool):
            if -len(obj) <= argument < len(obj):
                return obj[argument]
        return self.undefined(obj=obj, name=argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self.getitem(obj, attribute)


_ENV = _DataEnvironment()


def _parse(text: str) -> nodes.Expr:
    parser = Parser(_ENV, text, state="variable")
    expression = parser.parse_expression()
    if not parser.stream.eos:
        token = parser.stream.current
        raise TemplateSyntaxError(f"unexpected {token.value!r} after the expression", token.lineno)
    return expression


def _key(node: nodes.Node) -> Any:
    """The literal key of `x.key` / `x["key"]` / `x[0]`, or None when it is computed."""
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value
    return None


def _step_problem(node: nodes.Node, parents: dict[int, nodes.Node], ancestors: Container[str]) -> str | None:
    """A `steps` name must read steps.ID.output with ID among the ancestors."""
    read = parents.get(id(node))
    if not isinstance(read, (nodes.Getattr, nodes.Getitem)) or read.node is not node:
        return "steps must be followed by a step id and .output, e.g. steps.plan.output"
    step_id = _key(read)
    if not isinstance(step_id, str):
        return "steps must be followed by a literal step id, e.g. steps.plan.output"
    output = parents.get(id(read))
    if not isinstance(output, (nodes.Getattr, nodes.Getitem)) or output.node is not read or _key(output) != "output":
        return f"steps.{step_id} must be followed by .output (a step's data is its output)"
    if step_id not in ancestors:
        return f"refers to step {step_id!r}, which is not among this step's ancestors (its needs)"
    return None


def _node_problem(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Call):
        return "calls are not allowed"
    if isinstance(node, nodes.Filter):
        return f"filters are not allowed (|{node.name})"
    if isinstance(node, nodes.Test):
        return f"tests are not allowed (is {node.name}); compare instead, e.g. x == none"
    if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
        return f"attribute {node.attr!r} is not data; a name starting with _ can only be read as x[{node.attr!r}]"
    if isinstance(node, nodes.Name) and node.name not in NAMES:
        if node.name in ("item", "index"):
            return f"{node.name} is not available: when decides once for the whole step, before its items"
        return f"unknown name {node.name!r}: an expression reads only input and steps"
    if not isinstance(node, ALLOWED):
        return f"{type(node).__name__} is not allowed: only comparisons, and, or, not, literals and data"
    return None


def when_problems(text: str, *, ancestors: Container[str]) -> list[str]:
    """What is wrong with a `when` expression, checked when the workflow is posted: a syntax error, or anything
    beyond comparisons / and / or / not / literals / reading input and steps.ID.output of an ancestor. Empty when
    it is fine."""
    if not isinstance(text, str) or not text.strip():
        return ["must be a non-empty expression string, e.g. steps.plan.output.ok and input.vip"]
    if len(text) > MAX_LENGTH:
        return [f"is {len(text)} characters long; at most {MAX_LENGTH}"]
    if text.strip().startswith("{{"):
        return ["is an expression, not a template: write it without {{ }}, e.g. input.vip"]
    try:
        expression = _parse(text)
    except TemplateSyntaxError as exc:
        message = (exc.message or "").replace("end of template", "end of the expression")
        return [f"is not a valid expression: {message}"]
    except RecursionError:
        return ["is nested too deeply"]
    problems: list[str] = []
    parents: dict[int, nodes.Node] = {}
    todo: list[nodes.Node] = [expression]
    while todo:
        node = todo.pop()
        problem = _node_problem(node)
        if problem is None and isinstance(node, nodes.Name) and node.name == "steps":
            problem = _step_problem(node, parents, ancestors)
        if problem is not None:
            if problem not in problems:
                problems.append(problem)
            continue  # what is under a refused node says nothing more
        children = list(node.iter_child_nodes())
        for child in children:
            parents[id(child)] = node
        todo.extend(reversed(children))
    return problems


@lru_cache(maxsize=1024)
def _compiled(text: str):
    return _ENV.compile_expression(text, undefined_to_none=True)


def _plain(value: Any) -> Any:
    """The value as JSON can hold it (it is journaled in step_skipped): undefined is null, a tuple a list."""
    if isinstance(value, Undefined):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def when_true(text: str, context: dict) -> tuple[bool, Any]:
    """Evaluate a `when` over context {"input": ..., "steps": {id: {"output": ...}}}: (its truthiness, the value
    itself, journaled with step_skipped). Data that is missing reads as undefined: falsy, equal to nothing, and
    an ordering comparison with it (<, >) makes the whole expression false rather than an error. Any other
    failure (comparing a string with a number) is a definite StepError "when_error"."""
    try:
        value = _compiled(text)(input=context.get("input"), steps=context.get("steps") or {})
    except UndefinedError:
        return False, None
    except TemplateSyntaxError as exc:  # not validated when posted (an older version's definition)
        raise StepError(f"when {text!r} is not a valid expression: {exc.message}", code="when_error") from None
    except Exception as exc:
        raise StepError(f"when {text!r} failed: {type(exc).__name__}: {exc}", code="when_error") from None
    value = _plain(value)
    return bool(value), value

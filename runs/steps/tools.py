"""tool_call: Python tools registered by name. Built in: echo, sleep.

A tool is fn(args, ctx) registered with tool(name), or a typed function registered with typed_tool (pal.tools'
@tool): its arguments are checked against its type hints (pydantic), which also give the JSON Schema that an
llm_call with `tools` offers the model."""

import inspect
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from pydantic_core import to_jsonable_python

from ..errors import StepError
from .base import StepContext, StepKind, register, run_masked

ANY_OBJECT: dict = {"type": "object", "additionalProperties": True}


class ArgumentsInvalid(ValueError):
    """A tool's arguments do not fit its type hints: field is where (e.g. "amount"), message what."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Tool:
    """A registered tool: run(args, ctx) gives its output; schema is the JSON Schema of args."""

    name: str
    run: Callable[[dict, StepContext], Any]
    schema: dict = field(default_factory=lambda: dict(ANY_OBJECT))
    description: str = ""
    check: Callable[[dict], Any] | None = None  # the arguments as the function takes them, else ArgumentsInvalid
    path: str = ""  # module.qualname of a typed tool's function: one name, one function
    pure: bool = False  # no effect outside the database: consecutive pure steps share a commit (a crash re-runs them)

    def checked(self, args: Any) -> Any:
        """args as the tool takes them; ArgumentsInvalid naming the first bad field."""
        if not isinstance(args, dict):
            raise ArgumentsInvalid("arguments", "must be a JSON object")
        return self.check(args) if self.check is not None else args

    def offered(self) -> dict:
        """The tool as an OpenAI-style function tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema},
        }


TOOLS: dict[str, Tool] = {}


def tool(name: str, *, pure: bool = False):
    """Register fn(args, ctx) as a tool. ctx.key is the attempt's idempotency key; ctx.emit(kind, payload)
    writes a custom journal event. pure: it has no effect outside the database (a crash may run it again)."""

    def decorate(fn):
        TOOLS[name] = Tool(name=name, run=fn, description=_doc_line(fn), pure=pure)
        return fn

    return decorate


def typed_tool(fn: Callable, *, name: str | None = None, description: str | None = None, pure: bool = False) -> Tool:
    """Register a typed function as a tool: its parameters (all but one named ctx, which gets the StepContext) are
    the arguments, checked against their type hints; its return value is made JSON (pydantic's rules)."""
    name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    fields: dict[str, Any] = {}
    takes_ctx = False
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.name == "ctx":
            takes_ctx = True
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"@tool {name}: *args and **kwargs cannot be offered to a model")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints.get(parameter.name, Any), default)
    model = pydantic.create_model(f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)

    def check(args: dict) -> dict:
        try:
            parsed = model.model_validate(args)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc") or ()) or "arguments"
            raise ArgumentsInvalid(where, first.get("msg", "is not valid")) from None
        return {key: getattr(parsed, key) for key in fields}

    def run(args: dict, ctx: StepContext) -> Any:
        try:
            values = check(args)
        except ArgumentsInvalid as exc:
            raise StepError(f"tool {name}: {exc}", code="bad_args", details={"field": exc.field}) from None
        return to_jsonable_python(fn(**values, ctx=ctx) if takes_ctx else fn(**values))

    path = f"{fn.__module__}.{fn.__qualname__}"
    registered = Tool(name, run, schema, description or _doc_line(fn), check, path, pure)
    known = TOOLS.get(name)
    if known is not None and known.path and known.path != path:
        raise ValueError(f"tool {name!r} is registered twice: {known.path} and {registered.path}")
    TOOLS[name] = registered
    return registered


def _doc_line(fn: Callable) -> str:
    return (inspect.getdoc(fn) or "").strip().split("\n\n")[0].replace("\n", " ")


@tool("echo", pure=True)
def echo(args: dict, ctx: StepContext) -> Any:
    """Returns its arguments."""
    return args


@tool("sleep")
def sleep(args: dict, ctx: StepContext) -> Any:
    """Sleeps args.seconds and returns {"slept": seconds}."""
    seconds = args.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise StepError("args.seconds must be a non-negative number", code="bad_args")
    deadline = time.monotonic() + seconds
    # Sleep in short naps so a lost lease (a steal or a cancel) stops the step early.
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))
        ctx.check_lease()
    return {"slept": seconds}


TOOLS["sleep"] = Tool(
    name="sleep",
    run=sleep,
    schema={"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0}}, "required": ["seconds"]},
    description="Sleeps this many seconds.",
)


@register
class ToolCall(StepKind):
    kind = "tool_call"
    required = ("tool",)
    optional = ("args",)
    templated = ("args",)

    def validate(self, step):
        errors = []
        name = step.get("tool")
        if not isinstance(name, str) or not name:
            errors.append(("tool", "must be the name of a registered tool"))
        elif name not in TOOLS:
            errors.append(("tool", f"unknown tool {name!r}; registered: {', '.join(sorted(TOOLS))}"))
        if "args" in step and not isinstance(step["args"], dict):
            errors.append(("args", "must be an object"))
        return errors

    def run(self, step, ctx):
        registered = TOOLS.get(step["tool"])
        if registered is None:
            raise StepError(f"unknown tool {step['tool']!r}", code="unknown_tool")
        # A tool's output, errors and events are journaled: masked, should it have handled a secret.
        return run_masked(lambda fields, context: registered.run(fields.get("args") or {}, context), step, ctx)

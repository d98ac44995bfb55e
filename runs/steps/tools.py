"""tool_call: Python tools registered by name. Built in: echo, sleep."""

import time
from collections.abc import Callable
from typing import Any

from ..errors import StepError
from .base import StepContext, StepKind, register, run_masked

TOOLS: dict[str, Callable[[dict, StepContext], Any]] = {}


def tool(name: str):
    """Register fn(args, ctx) as a tool. ctx.key is the attempt's idempotency key; ctx.emit(kind, payload)
    writes a custom journal event."""

    def decorate(fn):
        TOOLS[name] = fn
        return fn

    return decorate


@tool("echo")
def echo(args: dict, ctx: StepContext) -> Any:
    return args


@tool("sleep")
def sleep(args: dict, ctx: StepContext) -> Any:
    seconds = args.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise StepError("args.seconds must be a non-negative number", code="bad_args")
    deadline = time.monotonic() + seconds
    # Sleep in short naps so a lost lease (a steal or a cancel) stops the step early.
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))
        ctx.check_lease()
    return {"slept": seconds}


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
        fn = TOOLS.get(step["tool"])
        if fn is None:
            raise StepError(f"unknown tool {step['tool']!r}", code="unknown_tool")
        # A tool's output, errors and events are journaled: masked, should it have handled a secret.
        return run_masked(lambda fields, context: fn(fields.get("args") or {}, context), step, ctx)

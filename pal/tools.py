"""Tools written in Python (contract section 11): @tool on a typed function registers it by its name.

Its arguments are checked against its type hints, which also give the JSON Schema that an llm_call with `tools`
offers the model; a parameter named ctx gets the call's StepContext (ctx.key: its idempotency key)."""

from collections.abc import Callable
from typing import Any

from runs.steps.tools import TOOLS, ArgumentsInvalid, Tool, typed_tool

__all__ = ["TOOLS", "ArgumentsInvalid", "Tool", "tool"]


def tool(
    fn: Callable | None = None, *, name: str | None = None, description: str | None = None, pure: bool = False
) -> Any:
    """@tool or @tool(name=..., description=..., pure=...): register fn; fn itself is returned, callable as it is.
    pure: no effect outside the database, so a crash may run it again (its rows may share a commit)."""

    def decorate(fn: Callable) -> Callable:
        registered = typed_tool(fn, name=name, description=description, pure=pure)
        fn.pal_tool = registered  # type: ignore[attr-defined]
        return fn

    return decorate(fn) if fn is not None else decorate

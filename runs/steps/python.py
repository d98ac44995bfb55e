"""python: one call of a @step function of a Python workflow (runs.code), by its dotted path.

{"kind": "python", "function": "app.workflows.fetch_invoice", "args": [...], "kwargs": {...}}: the function's
return value is the output (JSON); an exception fails the step (code step_error, its class in details). While it
runs, pal.workflows.current_step() gives its key and attempt (hand the key to a provider)."""

import random
import threading
import uuid
from typing import Any

from pal.clock import db_now

from ..code import STEPS, CodeStep
from ..errors import StepError
from .base import StepContext, StepKind, register, run_masked

running = threading.local()  # .ctx: the StepContext of the python step this thread runs


def builtin(fn):
    """The engine's own values of a workflow (ctx.now, ctx.uuid, ctx.random): journaled as python steps."""
    path = f"{__name__}.{fn.__name__}"
    STEPS[path] = CodeStep(fn=fn, path=path, name=fn.__name__)
    return fn


@builtin
def now() -> str:
    return db_now().isoformat()  # the database's clock: the one every host agrees on (pal.clock)


@builtin
def uuid4() -> str:
    return str(uuid.uuid4())


@builtin
def random_value() -> float:
    return random.random()


class UserStepError(StepError):
    """What a @step function raised, as the step's failure (its class, so a workflow can tell them apart)."""


@register
class Python(StepKind):
    kind = "python"
    required = ("function",)
    optional = ("args", "kwargs")

    def validate(self, step):
        path = step.get("function")
        if not isinstance(path, str) or path not in STEPS:
            return [("function", f"must be the dotted path of a @step function; {path!r} is none")]
        return []

    def run(self, step, ctx):
        code = STEPS.get(step.get("function") or "")
        if code is None:
            raise StepError(f"no @step function {step.get('function')!r} is loaded here", code="unknown_function")
        return run_masked(lambda fields, context: _call(code, fields, context), step, ctx)


def _call(code: CodeStep, fields: dict, ctx: StepContext) -> Any:
    running.ctx = ctx
    try:
        return code.fn(*(fields.get("args") or []), **(fields.get("kwargs") or {}))
    except StepError:
        raise
    except Exception as exc:
        raise UserStepError(
            f"{type(exc).__name__}: {exc}",
            code="step_error",
            details={"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}"},
        ) from None
    finally:
        running.ctx = None

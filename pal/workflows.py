"""Workflows written in Python (contract section 11): @workflow on def fn(ctx, input), @step on a plain function.

Modules named in PAL_WORKFLOW_MODULES and each installed app's workflows.py are imported at start-up; a run of a
code workflow replays its function against the journal (runs.walk.code), so every @step and ctx call is a
journaled step, done once. current_step() inside a @step gives its attempt's key and attempt."""

import functools
import re
from collections.abc import Callable
from typing import Any

from runs.code import STEPS, WORKFLOWS, CodeStep, CodeWorkflow, calls, module_version, path_of, source_of
from runs.services import run_create
from runs.steps.base import NAME_RE
from runs.steps.python import running
from runs.walk.code import Call, StepFailed, WorkflowContext
from runs.workflows import WorkflowInvalid, attribute_problems, validate_definition

__all__ = ["StepFailed", "WorkflowContext", "current_step", "step", "workflow"]

STEP_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,60}$")


def step(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    retry: dict | None = None,
    timeout_seconds=None,
    pure: bool = False,
):
    """Each call of fn inside a workflow is a step of kind python: its arguments and return value (JSON)
    journaled, its output reused on replay. Outside a workflow fn is called as it is. pure: fn has no effect
    outside the database, so a crash may call it again (as a JSON python step its rows may share a commit)."""

    def decorate(fn: Callable) -> Callable:
        code = CodeStep(
            fn=fn, path=path_of(fn), name=name or fn.__name__, retry=retry, timeout_seconds=timeout_seconds, pure=pure
        )
        if not STEP_NAME_RE.match(code.name):
            raise ValueError(f"@step name {code.name!r} must be 1-60 of A-Z a-z 0-9 _ -")
        _policy_check(code.name, retry, timeout_seconds)
        STEPS[code.path] = code

        @functools.wraps(fn)
        def call(*args, **kwargs):
            channel = calls()
            if channel is None:
                return fn(*args, **kwargs)
            fields = {"function": code.path, "args": list(args), "kwargs": kwargs}
            return channel.ask(Call(code.name, "python", fields, retry=retry, timeout_seconds=timeout_seconds))

        call.pal_step = code  # type: ignore[attr-defined]
        return call

    return decorate(fn) if fn is not None else decorate


class Workflow:
    """A registered code workflow: start() makes a run of it; calling it runs the function (a test may)."""

    def __init__(self, code: CodeWorkflow):
        self.code = code
        self.name = code.name
        functools.update_wrapper(self, code.fn)

    def __call__(self, ctx, input):
        return self.code.fn(ctx, input)

    def start(
        self, input: dict | None = None, *, idempotency_key: str | None = None, by: str = "python", priority: int = 0
    ) -> str:
        """Make a run in the caller's transaction (its first task is sent after the commit); its id. priority:
        -100..100, higher sooner (as POST /runs takes it)."""
        run, _ = run_create(
            workflow_name=self.name,
            input=input or {},
            idempotency_key=idempotency_key,
            created_by=by,
            priority=priority,
        )
        return str(run.id)


def workflow(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    version: str | int | None = None,
    concurrency: dict | None = None,
    budget: dict | None = None,
    attributes: dict | None = None,
):
    """Register def fn(ctx, input) -> JSON as the workflow `name` (fn's name by default), started like any.
    attributes: {NAME: template} as a JSON workflow's, over input and steps by their ids (steps.classify.output)."""

    def decorate(fn: Callable) -> Workflow:
        wname = name or fn.__name__
        if not NAME_RE.match(wname):
            raise ValueError(f"workflow name {wname!r} must be 1-64 of a-z 0-9 - _")
        options = {k: v for k, v in (("concurrency", concurrency), ("budget", budget)) if v is not None}
        try:  # the options as a JSON workflow's are checked, with one stand-in step
            validate_definition({"name": wname, "steps": [{"id": "x", "kind": "tool_call", "tool": "echo"}], **options})
        except WorkflowInvalid as exc:
            raise ValueError(f"@workflow {wname}: {exc}") from None
        if attributes is not None:  # any step id: the steps are the code's calls
            problems = attribute_problems(attributes, known=None)
            if problems:
                raise ValueError(f"@workflow {wname}: " + "; ".join(f"{loc}: {msg}" for loc, msg in problems))
            options["attributes"] = attributes
        code = CodeWorkflow(
            fn=fn,
            name=wname,
            path=path_of(fn),
            version=str(version) if version is not None else module_version(fn),
            source=source_of(fn),
            description=(fn.__doc__ or "").strip().split("\n")[0],
            options=options,
        )
        known = WORKFLOWS.get(wname)
        if known is not None and known.path != code.path:
            raise ValueError(f"workflow {wname!r} is registered twice: {known.path} and {code.path}")
        WORKFLOWS[wname] = code
        return Workflow(code)

    return decorate(fn) if fn is not None else decorate


def current_step() -> Any:
    """Inside a @step function as a step: its StepContext (.key, .attempt, .run_id); None elsewhere."""
    return getattr(running, "ctx", None)


def _policy_check(name: str, retry: dict | None, timeout_seconds) -> None:
    step: dict[str, Any] = {"id": "x", "kind": "tool_call", "tool": "echo"}
    if retry is not None:
        step["retry"] = retry
    if timeout_seconds is not None:
        step["timeout_seconds"] = timeout_seconds
    try:
        validate_definition({"name": "x", "steps": [step]})
    except WorkflowInvalid as exc:
        raise ValueError(f"@step {name}: {exc}".replace("steps[0].", "")) from None

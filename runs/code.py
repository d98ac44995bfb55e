"""Workflows and steps written in Python: the registry the decorators of pal.workflows fill at import.

A code workflow is stored as a Workflow row whose definition names its function ("code") and its version (an
explicit one or a hash of its module's source), with no "steps": they are what its function calls, in order.
The walk replays the function against the journal (runs.walk.code)."""

import hashlib
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from journal.models import JournalEvent

WORKFLOWS: dict[str, "CodeWorkflow"] = {}  # by workflow name
STEPS: dict[str, "CodeStep"] = {}  # by the function's dotted path (module.qualname)


@dataclass(frozen=True)
class CodeStep:
    """A @step function: called inside a workflow it is a step of kind python (its id: name, name#2, ...)."""

    fn: Callable
    path: str
    name: str
    retry: dict | None = None
    timeout_seconds: float | None = None
    pure: bool = False  # no effect outside the database: its rows may share a commit with the next pure step's


@dataclass
class CodeWorkflow:
    """A @workflow function and what its stored definition says of it."""

    fn: Callable
    name: str
    path: str
    version: str  # the explicit version= or the first 12 hex digits of its module's source's sha256
    source: str  # the function's own source, shown on the workflow's page
    description: str = ""
    options: dict = field(default_factory=dict)  # concurrency, budget: as in a JSON definition

    def definition(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "code": self.path,
            "code_version": self.version,
            "source": self.source,
            "steps": [],
            **self.options,
        }


def path_of(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def module_version(fn: Callable) -> str:
    """A hash of the source of the module that defines fn (of the function alone when the module has none)."""
    module = sys.modules.get(fn.__module__)
    try:
        source = inspect.getsource(module) if module is not None else inspect.getsource(fn)
    except (OSError, TypeError):
        source = getattr(fn.__code__, "co_code", b"").hex()
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def source_of(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def journal_order(run_id) -> list[tuple[str, str]]:
    """The steps a run's journal holds, in the order they first started: (step id, kind); items left out."""
    seen: dict[str, str] = {}
    started = JournalEvent.objects.filter(run_id=run_id, kind="step_started").order_by("seq")
    for step_id, kind in started.values_list("step_id", "payload__kind"):
        if step_id and "[" not in step_id and step_id not in seen:
            seen[step_id] = kind
    return list(seen.items())


def steps_of(run) -> list[dict]:
    """A run's steps as the pages and the API read them: a JSON workflow's definition's; a Python workflow's,
    the ones its journal holds, each after the one before (a ctx.map's as a for_each step)."""
    definition = run.workflow.definition
    if not is_code(definition):
        return definition.get("steps") or []
    return steps_taken([run.id])


def steps_taken(run_ids: list) -> list[dict]:
    """The steps some runs of a Python workflow took, as one graph (one read): each step once, in the order they
    first came, after every step that came just before it in some run (a ctx.map's as a for_each step). An edge
    that would close a cycle (runs of code that called them in another order) is left out."""
    chains: dict = {run_id: {} for run_id in run_ids}  # run -> {step id: kind}, in the order of first starts
    mapped: set[str] = set()
    started = JournalEvent.objects.filter(run_id__in=run_ids, kind="step_started").order_by("run_id", "seq")
    for run_id, step_id, kind in started.values_list("run_id", "step_id", "payload__kind"):
        if not step_id:
            continue
        if "[" in step_id:
            mapped.add(step_id.split("[", 1)[0])
        else:
            chains[run_id].setdefault(step_id, kind)
    steps: dict[str, dict] = {}
    for chain in chains.values():
        before = None
        for step_id, kind in chain.items():
            step = steps.setdefault(step_id, {"id": step_id, "kind": kind or "python"})
            if before is not None and before not in step.get("needs", []) and step_id not in _above(steps, before):
                step.setdefault("needs", []).append(before)
            before = step_id
    for step_id in mapped & set(steps):
        steps[step_id]["for_each"] = "code"
    return list(steps.values())


def _above(steps: dict[str, dict], step_id: str) -> set[str]:
    """The steps step_id needs, directly or through others."""
    seen, todo = set(), [step_id]
    while todo:
        for need in steps.get(todo.pop(), {}).get("needs", []):
            if need not in seen:
                seen.add(need)
                todo.append(need)
    return seen


def code_workflow(name: str) -> "CodeWorkflow | None":
    return WORKFLOWS.get(name)


def is_code(definition: dict) -> bool:
    return isinstance(definition, dict) and "code" in definition


# The code thread of a workflow's walk (runs.walk.code) sets .calls: a @step function called there becomes a step.
current = threading.local()


def calls() -> Any:
    """The walk's channel for the workflow function running on this thread, or None outside one."""
    return getattr(current, "calls", None)

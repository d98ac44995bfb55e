"""Workflow definitions: validation (docs/reference/workflows.md) and templates.

validate_definition returns the definition unchanged or raises WorkflowInvalid with one error per bad field,
each naming where it is ("steps[2].model") and what is wrong.
"""

import json
import re
from typing import Any

from .steps.base import NAME_RE, StepContext, StepError, get_kind

TEMPLATE_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
COMMON_FIELDS = ("id", "kind", "retry", "timeout_seconds")
NOT_YET: dict[str, str] = {}  # kinds named by the contract but not built yet
MAX_STEPS = 10_000


class WorkflowInvalid(ValueError):
    def __init__(self, errors: list[dict]):
        self.errors = errors
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors))


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def _check_template(path: str, earlier: set[str], all_ids: set[str]) -> str | None:
    if not PATH_RE.match(path):
        return f"template {{{{ {path} }}}} is not a dotted path like input.a or steps.ID.output.a"
    parts = path.split(".")
    if parts[0] == "input":
        return None
    if parts[0] == "steps":
        if len(parts) < 3 or parts[2] != "output":
            return f"template {{{{ {path} }}}} must read steps.ID.output[.field]"
        ref = parts[1]
        if ref in earlier:
            return None
        if ref in all_ids:
            return f"template {{{{ {path} }}}} refers to step {ref!r}, which does not run before this one"
        return f"template {{{{ {path} }}}} refers to unknown step {ref!r}"
    return f"template {{{{ {path} }}}} must start with input. or steps."


def validate_definition(definition: Any) -> dict:
    errors: list[dict] = []

    def err(loc, msg):
        errors.append({"loc": loc, "msg": msg})

    if not isinstance(definition, dict):
        raise WorkflowInvalid([{"loc": "definition", "msg": "must be a JSON object"}])
    for key in definition:
        if key not in ("name", "description", "steps"):
            err(key, "unknown field")
    name = definition.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        err("name", "must be 1-64 characters of a-z 0-9 - _")
    if "description" in definition and not isinstance(definition["description"], str):
        err("description", "must be a string")
    steps = definition.get("steps")
    if not isinstance(steps, list) or not steps:
        err("steps", "must be a non-empty list of steps")
        raise WorkflowInvalid(errors)
    if len(steps) > MAX_STEPS:
        err("steps", f"has {len(steps)} steps; at most {MAX_STEPS}")
        raise WorkflowInvalid(errors)

    all_ids: set[str] = {s["id"] for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)}
    seen: set[str] = set()
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if not isinstance(step, dict):
            err(where, "must be an object")
            continue
        step_id = step.get("id")
        if isinstance(step_id, str) and NAME_RE.match(step_id):
            where = f"steps[{index}] ({step_id})"
            if step_id in seen:
                err(f"{where}.id", f"duplicate step id {step_id!r}")
        else:
            err(f"{where}.id", "must be 1-64 characters of a-z 0-9 - _")
        kind_name = step.get("kind")
        kind = get_kind(kind_name) if isinstance(kind_name, str) else None
        if kind is None:
            if kind_name in NOT_YET:
                err(f"{where}.kind", f"kind {kind_name!r} is not supported yet (it comes with {NOT_YET[kind_name]})")
            else:
                err(f"{where}.kind", f"unknown kind {kind_name!r}")
        else:
            allowed = set(COMMON_FIELDS) | set(kind.required) | set(kind.optional)
            for key in step:
                if key not in allowed:
                    err(f"{where}.{key}", f"unknown field for kind {kind_name!r}")
            for key in kind.required:
                if key not in step:
                    err(f"{where}.{key}", "is required")
            for field_name, message in kind.validate(step):
                err(f"{where}.{field_name}", message)
        _validate_policy(step, where, err)
        for key, value in step.items():
            if key in COMMON_FIELDS:
                continue
            for path in templates_in(value):
                problem = _check_template(path, seen, all_ids)
                if problem:
                    err(f"{where}.{key}", problem)
        if isinstance(step_id, str):
            seen.add(step_id)
    if errors:
        raise WorkflowInvalid(errors)
    return definition


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
        if not _is_number(timeout) or not 0 < timeout <= 86_400:
            err(f"{where}.timeout_seconds", "must be a number of seconds above 0 and at most 86400")


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


def step_policy(step: dict) -> tuple[int, float]:
    retry = step.get("retry") or {}
    return int(retry.get("max_attempts", 1)), float(retry.get("backoff_seconds", 0))


def step_invoke(step: dict, ctx: StepContext, *, context: dict) -> Any:
    """Run one step: its templated fields rendered from the context ({input, steps}), its kind's code called with
    them. The one way a step is invoked (by a walk, and by an operator's "send again" of a side effect)."""
    kind = get_kind(step["kind"])
    if kind is None:
        raise StepError(f"unknown kind {step['kind']!r}", code="unknown_kind")
    fields = {
        k: (render(v, context, field=k) if k in kind.templated else v)
        for k, v in step.items()
        if k not in COMMON_FIELDS
    }
    return kind.run(fields, ctx)

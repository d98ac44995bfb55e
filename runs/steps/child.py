"""child_run: the parent's step creates a child run of a workflow and drives it itself (runs.walk)."""

from ..errors import StepError
from ..secrets import mask
from .base import NAME_RE, StepKind, register


@register
class ChildRun(StepKind):
    kind = "child_run"
    required = ("workflow",)
    optional = ("input",)
    templated = ("input",)

    def validate(self, step):
        errors = []
        name = step.get("workflow")
        # Existence is checked when the step runs: a workflow may call itself, or one posted later.
        if not isinstance(name, str) or not NAME_RE.match(name):
            errors.append(("workflow", "must be a workflow name (1-64 of a-z 0-9 - _)"))
        if "input" in step and not isinstance(step["input"], dict):
            errors.append(("input", "must be an object"))
        return errors

    def run(self, step, ctx):
        child_input = step.get("input") or {}
        if not isinstance(child_input, dict):
            raise StepError("input must render to an object", code="bad_input")
        # The child's input is kept as its run's input: with every configured secret masked, as the parent's own.
        return ctx.child(workflow=step["workflow"], input=mask(child_input))

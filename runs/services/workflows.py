"""Workflow definitions: posted and versioned, and read by name as POST /runs needs them."""

from django.db import IntegrityError, transaction

from pal import rows

from .. import selectors
from ..code import CodeWorkflow, code_workflow
from ..errors import Conflict, NotFound
from ..models import (
    Workflow,
)
from ..workflows import validate_definition

# --- workflows ------------------------------------------------------------------------------------


def workflow_create(*, definition: dict) -> Workflow:
    """Validate and store a definition; an existing name gets version + 1. Raises WorkflowInvalid."""
    validate_definition(definition)
    name = definition["name"]
    code = code_workflow(name)
    if code is not None:
        raise Conflict(f"workflow {name!r} is written in Python ({code.path}): change its code", code="code_workflow")
    return _versioned(name, definition)


def workflow_check(*, definition: dict, runs: int = selectors.CHECK_RUNS, ended: bool = False) -> dict:
    """Validate a definition (WorkflowInvalid) and replay the journals of its workflow's `runs` most recent runs that
    have not ended (ended: any) against it, storing nothing: {checked, diverging: [{run_id, step_id, code, why}]}."""
    validate_definition(definition)
    code = code_workflow(definition["name"])
    if code is not None:
        raise Conflict(f"workflow {definition['name']!r} is written in Python ({code.path})", code="code_workflow")
    return selectors.definition_divergence(definition=definition, runs=runs, ended=ended)


def _versioned(name: str, definition: dict) -> Workflow:
    for _ in range(5):
        latest = Workflow.objects.filter(name=name).order_by("-version").values_list("version", flat=True).first()
        try:
            with transaction.atomic():
                return Workflow.objects.create(
                    name=name,
                    version=(latest or 0) + 1,
                    description=definition.get("description", ""),
                    definition=definition,
                )
        except IntegrityError:
            continue  # two posts of the same name raced for the version number
    raise Conflict(f"could not allocate a version for workflow {name!r}; try again", code="version_race")


# Every POST /runs reads its workflow: SQL built once (pal.rows), as Workflow.objects.filter(...).first() would.
_WORKFLOW_LATEST = rows.Read(Workflow, "w", tail="FROM workflows w WHERE w.name = %s ORDER BY w.version DESC LIMIT 1")
_WORKFLOW_VERSION = rows.Read(Workflow, "w", tail="FROM workflows w WHERE w.name = %s AND w.version = %s LIMIT 1")


def code_workflow_stored(code: CodeWorkflow) -> Workflow:
    """The stored version of a Python workflow as this process's code has it: the newest with its code_version,
    else a new version (several processes on two deploys each find their own while both run)."""
    found = Workflow.objects.filter(name=code.name, definition__code_version=code.version).order_by("-version")
    return found.first() or _versioned(code.name, code.definition())


def workflow_get(*, name: str, version: int | None = None) -> Workflow:
    code = code_workflow(name) if not version else None
    if code is not None:
        return code_workflow_stored(code)
    if version:
        workflow = _WORKFLOW_VERSION.one([name, int(version)])
    else:
        workflow = _WORKFLOW_LATEST.one([name])
    if workflow is None:
        what = f"workflow {name!r}" + (f" version {version}" if version else "")
        raise NotFound(f"{what} does not exist", code="workflow_not_found")
    return workflow


class _Known:
    """The workflow versions this process has read for run_create, by (name, version asked: None for the latest)."""

    # A POST /runs read its workflow before its run's statement, a round trip of its own. A version never changes
    # (the admin can delete one no run uses, not edit it), but the latest of a name does whenever a new version is
    # posted, by any process. So a known workflow is used only under a check that the run's statement itself makes
    # (_runs_insert's `fresh`): the row is still there and, for the latest, no newer version of the name exists.
    # When the check fails, nothing is written and run_create reads the workflow again: what a read first would
    # have found, with the same snapshot rules (a version committed after the statement began is not seen either
    # way). Postgres only (the check is a part of the one statement); a few hundred names at most.

    LIMIT = 512

    def __init__(self):
        self.workflows: dict[tuple[str, int | None], Workflow] = {}

    def get(self, name: str, version: int | None) -> Workflow | None:
        return self.workflows.get((name, version))

    def keep(self, name: str, version: int | None, workflow: Workflow) -> None:
        if len(self.workflows) >= self.LIMIT:
            self.workflows.clear()
        self.workflows[(name, version)] = workflow

    def forget(self, name: str, version: int | None) -> None:
        self.workflows.pop((name, version), None)


_known = _Known()


def _fresh_check(workflow: Workflow, *, latest: bool) -> tuple[str, list]:
    """The condition every part of a run's statement is written under when it uses a known workflow (_Known)."""
    sql = "EXISTS (SELECT 1 FROM workflows WHERE id = %s AND name = %s AND version = %s)"
    params: list = [workflow.pk, workflow.name, workflow.version]
    if latest:
        sql += " AND NOT EXISTS (SELECT 1 FROM workflows WHERE name = %s AND version > %s)"
        params += [workflow.name, workflow.version]
    return sql, params


class _Stale(Exception):
    """A known workflow's check failed: the run's statement wrote nothing."""

"""The REST API's workflow calls (docs/reference/api.md): post a definition, list the latest versions, read one.

Reads go through runs.selectors, the post through runs.services.workflow_create; errors are answered by pal.api.
"""

from ninja import Query, Router, Status

from tokens.auth import operator, viewer

from .. import selectors, services
from .schemas import READ, WRITE, DefinitionCheckOut, WorkflowDetailOut, WorkflowIn, WorkflowListOut, WorkflowOut

router = Router()


def _workflow_out(workflow) -> dict:
    return {
        "name": workflow.name,
        "version": workflow.version,
        "description": workflow.description,
        "definition": workflow.definition,
        "created_at": workflow.created_at,
    }


@router.post(
    "/workflows",
    auth=operator,
    tags=["workflows"],
    response={201: WorkflowOut, 200: DefinitionCheckOut, **WRITE},
    summary="Post a workflow definition (an existing name makes a new version); dry_run: which recent runs of the "
    "workflow it would strand, storing nothing",
)
def workflow_post(
    request,
    definition: WorkflowIn,
    dry_run: bool = Query(False, description="check the definition against recent runs' journals; store nothing"),
    runs: int = Query(selectors.CHECK_RUNS, ge=1, le=1000, description="dry_run: the most recent runs checked"),
    ended: bool = Query(False, description="dry_run: runs that ended too, not only those that have not"),
):
    if dry_run:
        checked = services.workflow_check(definition=definition.model_dump(exclude_unset=True), runs=runs, ended=ended)
        return Status(200, checked)
    workflow = services.workflow_create(definition=definition.model_dump(exclude_unset=True))
    return Status(201, _workflow_out(workflow))


@router.get(
    "/workflows",
    auth=viewer,
    tags=["workflows"],
    response={200: WorkflowListOut, **READ},
    summary="The latest version of every workflow",
)
def workflow_list(request):
    items = [
        {
            "name": w.name,
            "version": w.version,
            "description": w.description,
            "steps": len(w.definition.get("steps", [])),
            "created_at": w.created_at,
        }
        for w in selectors.workflow_list_latest()
    ]
    return {"items": items}


@router.get(
    "/workflows/{name}",
    auth=viewer,
    tags=["workflows"],
    response={200: WorkflowDetailOut, **READ},
    summary="One workflow's latest version, with the list of its versions",
)
def workflow_detail(request, name: str):
    workflow = services.workflow_get(name=name)
    versions = [
        {"version": w.version, "description": w.description, "created_at": w.created_at}
        for w in selectors.workflow_versions(name=name)
    ]
    return {**_workflow_out(workflow), "versions": versions}

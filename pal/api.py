"""The REST API's wiring: the NinjaAPI, its routers, and one shape for every error: {"detail", "code"}."""

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError

from pal import db_away
from pal.middleware import CODES
from runs.api import decisions as decision_calls
from runs.api import moves as move_calls
from runs.api import pauses as pause_calls
from runs.api import reruns as rerun_calls
from runs.api import runs as run_calls
from runs.api import schedules as schedule_calls
from runs.api import views as view_calls
from runs.api import workflows as workflow_calls
from runs.services import ServiceError
from runs.workflows import WorkflowInvalid
from tokens.auth import TokensThrottled
from tokens.permissions import OPERATE, VIEW_RUN

log = logging.getLogger("pal.api")

# ninja names an operation <module>_<function>; the run and workflow calls keep the ids they had while they lived in
# one module runs/api.py (runs_api_run_post), so code generated from the OpenAPI document keeps its names.
OPERATION_ID_PREFIXES = {"runs.api.runs": "runs_api", "runs.api.workflows": "runs_api"}


class Api(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        module = operation.view_func.__module__
        return f"{OPERATION_ID_PREFIXES.get(module, module.replace('.', '_'))}_{operation.view_func.__name__}"


api = Api(
    title="PAL Ops API",
    version="1",
    urls_namespace="api",
    description=(
        "Durable agent workflows: post workflows, start and steer runs, read their journals. "
        "Send `Authorization: Bearer <token>` (`python manage.py pal_token USERNAME`). Reading needs the "
        f"permission {VIEW_RUN} (or {OPERATE}); every change needs {OPERATE}. Every error answers "
        '`{"detail": "...", "code": "..."}`.'
    ),
)
api.add_router("", workflow_calls.router)
api.add_router("", run_calls.router)
api.add_router("", schedule_calls.router)
api.add_router("", pause_calls.router)
api.add_router("", rerun_calls.router)
api.add_router("", view_calls.router)
api.add_router("", decision_calls.router)
api.add_router("", move_calls.router)


def _error(request, status: int, detail: str, code: str, errors: list | None = None, headers: dict | None = None):
    body: dict[str, Any] = {"detail": detail, "code": code}
    if errors is not None:
        body["errors"] = errors
    response = api.create_response(request, body, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _loc(loc) -> str:
    """("body", "definition", "steps", 2, "id") -> "steps[2].id"; ("query", "limit") -> "query.limit"."""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[2:]  # the body's parameter name says nothing to the client
        if not parts:
            return "body"  # the whole body is missing or not an object
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@api.exception_handler(ServiceError)
def service_error(request, exc: ServiceError):
    return _error(request, exc.status, exc.detail, exc.code)


@api.exception_handler(WorkflowInvalid)
def workflow_invalid(request, exc: WorkflowInvalid):
    return _error(request, 422, f"the workflow is not valid: {exc}", "invalid_workflow", errors=exc.errors)


@api.exception_handler(ValidationError)
def validation_error(request, exc: ValidationError):
    errors = [{"loc": _loc(e.get("loc", ())), "msg": e.get("msg", "is not valid")} for e in exc.errors]
    detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors) or "the request is not valid"
    return _error(request, 422, detail, "validation_error", errors=errors)


@api.exception_handler(AuthenticationError)
def not_authenticated(request, exc: AuthenticationError):
    detail = str(exc) if str(exc) != "Unauthorized" else "this call needs 'Authorization: Bearer <token>'"
    return _error(request, 401, detail, "not_authenticated", headers={"WWW-Authenticate": "Bearer"})


@api.exception_handler(TokensThrottled)
def tokens_throttled(request, exc: TokensThrottled):
    return _error(request, 429, str(exc), "too_many_bad_tokens", headers={"Retry-After": str(exc.retry_after)})


@api.exception_handler(AuthorizationError)
def forbidden(request, exc: AuthorizationError):
    return _error(request, 403, str(exc), "forbidden")


@api.exception_handler(HttpError)
def http_error(request, exc: HttpError):
    detail = str(exc)
    if exc.status_code == 400 and detail.startswith("Cannot parse request body"):
        return _error(request, 400, "the request body is not valid JSON", "malformed_json")
    return _error(request, exc.status_code, detail, CODES.get(exc.status_code, "error"))


@api.exception_handler(RequestDataTooBig)
def too_big(request, exc):
    return _error(
        request, 413, f"the request body is larger than {settings.PAL_API_MAX_BODY_BYTES} bytes", "body_too_large"
    )


@api.exception_handler(Http404)
def not_found(request, exc):
    return _error(request, 404, "not found", "not_found")


@api.exception_handler(Exception)
def internal_error(request, exc):
    refusal = db_away.refusal_after(exc)
    if refusal:  # the database went away during the call: 503 unavailable, safe to send again
        log.warning("%s %s: 503, %s", request.method, request.path, refusal)
        return db_away.api_unavailable(refusal)
    # Never expected: every refusal is a ServiceError. Logged with its traceback; the client gets JSON.
    log.exception("unhandled error in %s %s", request.method, request.path)
    return _error(request, 500, "internal error: the server failed; the request may be retried", "internal_error")

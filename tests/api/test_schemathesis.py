"""A property-based run of schemathesis over /api/v1/openapi.json with an operator token: no 5xx, and every
answer matches the schema (status codes, content types, bodies). Bounded by max_examples (about a minute)."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import drive_to_end, echo_step, make_run, make_workflow

from .conftest import make_user, token_for

# Not negative_data_rejection: the API ignores unknown query parameters (as Django does), which that check
# counts as accepting invalid data.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def operator_token(db):
    # Something to find: a workflow and runs in several states (generated ids rarely hit them; names may).
    workflow = make_workflow(name="a", steps=[echo_step("a")])
    drive_to_end(make_run(workflow=workflow))
    make_run(workflow=workflow)
    return token_for(make_user("schemathesis", "runs.view_run", "runs.operate"))


def _load_schema():
    from pal.wsgi import application

    # Served by the WSGI app in this process (no database is touched to serve the schema).
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


schema = _load_schema()


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """Like Django's test client: the end of each in-process request must not close the test's connection
    (it would, being inside the test's transaction)."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
def test_the_api_keeps_its_schema_and_never_fails(case, operator_token):
    case.call_and_validate(headers={"Authorization": f"Bearer {operator_token}"}, checks=CHECKS)

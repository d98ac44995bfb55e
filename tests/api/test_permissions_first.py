"""Permissions before the body: a caller who may not make a call is told 403 whatever its body holds, on every
route that takes one (a bad body is a 422 only for those who may send it)."""

import uuid

import pytest

from pal.api import api

from .conftest import assert_error

pytestmark = pytest.mark.django_db

BODY_ROUTES = sorted(
    (method.upper(), path.removeprefix("/api/v1"))
    for path, item in api.get_openapi_schema()["paths"].items()
    for method in item
    if method in ("post", "put", "patch")
)
ID = str(uuid.uuid4())


def concrete(path: str) -> str:
    return path.replace("{id}", ID).replace("{run_id}", ID).replace("{step_id}", "s").replace("{name}", "w")


def test_there_are_routes_that_take_a_body():
    assert len(BODY_ROUTES) >= 12, BODY_ROUTES
    assert ("POST", "/runs/{id}/fork/preview") in BODY_ROUTES


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
def test_a_user_with_neither_role_gets_403_for_a_bad_body(nobody, method, path):
    response = nobody.client.generic(
        method,
        "/api/v1" + concrete(path),
        b"{not json",
        content_type="application/json",
        headers=nobody._headers(None),
    )
    assert_error(response, 403)


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
def test_no_token_gets_401_for_a_bad_body(anonymous, method, path):
    response = anonymous.client.generic(
        method, "/api/v1" + concrete(path), b"{not json", content_type="application/json"
    )
    assert_error(response, 401)


# Calls that change nothing but take a body, open to a viewer: a bad body is theirs to be told of (422).
READS_WITH_A_BODY: set[tuple[str, str]] = set()


@pytest.mark.parametrize(("method", "path"), [route for route in BODY_ROUTES if route not in READS_WITH_A_BODY])
def test_a_viewer_gets_403_for_a_bad_body_on_every_call_that_needs_an_operator(viewer, method, path):
    response = viewer.client.generic(
        method,
        "/api/v1" + concrete(path),
        b"{not json",
        content_type="application/json",
        headers=viewer._headers(None),
    )
    assert_error(response, 403)

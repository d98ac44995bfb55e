"""One set of permission names (tokens.permissions): the pages (session login) and the API (bearer token) let the
same users do the same things, action by action, and the admin's operate check agrees with both."""

import json

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client, RequestFactory

from runs.admin import RunAdmin
from runs.models import Run, RunStatus
from tests.helpers import drive, echo_step, make_run
from tokens import auth
from tokens.permissions import OPERATE, READ_PERMISSIONS, ROLE_PERMISSIONS, VIEW_RUN
from tokens.services import token_create

from .conftest import logged_in, make_user

pytestmark = pytest.mark.django_db

APPROVAL = {"id": "review", "kind": "approval", "prompt": "Send the reply?"}

# The users: which permissions they hold.
HOLDERS = {
    "nobody": {"perms": ()},
    "viewer": {"perms": (VIEW_RUN,)},
    "operator without view_run": {"perms": (OPERATE,)},
    "viewer and operator": {"perms": (VIEW_RUN, OPERATE)},
    "superuser": {"perms": (), "superuser": True},
}

# Each action as the page asks it and as the API asks it: (page method, page path, page form, API method, API path,
# API body, which role it needs).
ACTIONS = {
    "read the run": ("get", "/runs/{id}/", None, "get", "/runs/{id}", None, "viewer"),
    "read the waterfall": ("get", "/runs/{id}/waterfall/", None, "get", "/runs/{id}/waterfall", None, "viewer"),
    "read the receipt": ("get", "/runs/{id}/receipt/", None, "get", "/runs/{id}/receipt", None, "viewer"),
    "preview a re-drive": ("get", "/runs/{id}/redrive/", None, "get", "/runs/{id}/redrive/preview", None, "viewer"),
    "cancel": ("post", "/runs/{id}/cancel/", {"reason": "r"}, "post", "/runs/{id}/cancel", {"reason": "r"}, "operator"),
    "retry": ("post", "/runs/{id}/retry/", {"reason": "r"}, "post", "/runs/{id}/retry", {"reason": "r"}, "operator"),
    "re-drive": (
        "post",
        "/runs/{id}/redrive/",
        {"reason": "r"},
        "post",
        "/runs/{id}/redrive",
        {"reason": "r"},
        "operator",
    ),
    "approve": (
        "post",
        "/runs/{id}/approvals/review/",
        {"approved": "1"},
        "post",
        "/runs/{id}/approvals/review",
        {"approved": True},
        "operator",
    ),
    "signal": ("post", "/runs/{id}/signals/", {"name": "go"}, "post", "/runs/{id}/signals/go", {}, "operator"),
}


def waiting_on_approval() -> Run:
    run = make_run(steps=[echo_step("a"), APPROVAL])
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def page_allowed(client: Client, method: str, path: str, form) -> bool:
    response = getattr(client, method)(path, form or {})
    assert not response.get("Location", "").startswith(settings.LOGIN_URL), "a logged-in user stays logged in"
    return response.status_code != 403


def api_allowed(token: str, method: str, path: str, body) -> bool:
    headers = {"Authorization": f"Bearer {token}"}
    client = Client()
    if method == "get":
        response = client.get("/api/v1" + path, headers=headers)
    else:
        response = client.post("/api/v1" + path, json.dumps(body), content_type="application/json", headers=headers)
    assert response.status_code != 401, "the token is valid"
    return response.status_code != 403


@pytest.mark.parametrize("holder", list(HOLDERS))
@pytest.mark.parametrize("action", list(ACTIONS))
def test_the_page_and_the_api_let_the_same_users_do_each_action(holder, action):
    spec = HOLDERS[holder]
    user = make_user("u", *spec["perms"], superuser=spec.get("superuser", False))
    token = token_create(user=user, name="test")[1]
    page_method, page_path, form, api_method, api_path, body, role = ACTIONS[action]
    expected = spec.get("superuser", False) or any(p in spec["perms"] for p in ROLE_PERMISSIONS[role])

    # A fresh run for each side, so that one side's action does not change what the other is asked.
    on_page = waiting_on_approval()
    by_api = waiting_on_approval()
    assert page_allowed(logged_in(user), page_method, page_path.format(id=on_page.id), form) is expected
    assert api_allowed(token, api_method, api_path.format(id=by_api.id), body) is expected


def test_the_tokens_roles_check_the_names_the_pages_check():
    assert auth.viewer.permissions == auth.viewer_async.permissions == READ_PERMISSIONS == (VIEW_RUN, OPERATE)
    assert auth.operator.permissions == ROLE_PERMISSIONS["operator"] == (OPERATE,)


def test_every_permission_name_is_one_the_database_holds():
    for name in {p for names in ROLE_PERMISSIONS.values() for p in names}:
        app_label, codename = name.split(".")
        assert Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists(), name


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_the_admins_operate_check_agrees_with_the_pages(holder):
    spec = HOLDERS[holder]
    user = make_user("u", *spec["perms"], superuser=spec.get("superuser", False))
    request = RequestFactory().get("/admin/runs/run/")
    request.user = user
    admin_says = RunAdmin(Run, admin.site).has_operate_permission(request)
    page = logged_in(user)
    on_page = waiting_on_approval()
    assert admin_says is page_allowed(page, "post", f"/runs/{on_page.id}/cancel/", {"reason": "r"})

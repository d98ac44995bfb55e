"""Fixtures for the REST API tests: users with each role, their tokens, and a client that sends them."""

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from tokens.services import token_create

API = "/api/v1"


class Api:
    """The Django test client, speaking JSON to /api/v1 with one bearer token (or none)."""

    def __init__(self, token: str | None):
        self.client = Client()
        self.token = token

    def _headers(self, headers):
        sent = {} if self.token is None else {"Authorization": f"Bearer {self.token}"}
        sent.update(headers or {})
        return sent

    def get(self, path, params=None, headers=None):
        return self.client.get(API + path, params or {}, headers=self._headers(headers))

    def post(self, path, body=None, headers=None, raw: bytes | str | None = None, content_type="application/json"):
        data = raw if raw is not None else json.dumps({} if body is None else body)
        return self.client.post(API + path, data, content_type=content_type, headers=self._headers(headers))

    def delete(self, path, body=None, headers=None):
        data = json.dumps({} if body is None else body)
        return self.client.delete(API + path, data, content_type="application/json", headers=self._headers(headers))

    def method(self, verb, path, headers=None):
        return self.client.generic(verb, API + path, headers=self._headers(headers))


def make_user(username: str, *perms: str, superuser: bool = False) -> User:
    user = User.objects.create_user(username=username, is_superuser=superuser)  # no password: no slow hashing
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def token_for(user) -> str:
    return token_create(user=user, name="test")[1]


@pytest.fixture
def viewer(db):
    return Api(token_for(make_user("vera", "runs.view_run")))


@pytest.fixture
def operator(db):
    return Api(token_for(make_user("otto", "runs.view_run", "runs.operate")))


@pytest.fixture
def superuser(db):
    return Api(token_for(make_user("root", superuser=True)))


@pytest.fixture
def nobody(db):
    """A valid token of a user with neither role."""
    return Api(token_for(make_user("nora")))


@pytest.fixture
def anonymous(db):
    return Api(None)


def assert_error(response, status: int, code: str | None = None):
    """Every error of the API is JSON {detail, code}."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("detail"), str) and body["detail"], body
    assert isinstance(body.get("code"), str) and body["code"], body
    if code is not None:
        assert body["code"] == code, body
    return body

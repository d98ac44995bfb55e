"""Fixtures for the operator's pages: logged-in clients for each role, and htmx requests."""

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client


def make_user(username: str, *perms: str, superuser: bool = False) -> User:
    user = User.objects.create_user(username=username, is_superuser=superuser)  # no password: force_login
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db):
    """Can read (runs.view_run), cannot act."""
    return logged_in(make_user("vera", "runs.view_run"))


@pytest.fixture
def operator(db):
    """Can read and act (runs.operate)."""
    return logged_in(make_user("otto", "runs.view_run", "runs.operate"))


@pytest.fixture
def nobody(db):
    """Logged in, with neither permission."""
    return logged_in(make_user("nora"))


@pytest.fixture
def anonymous(db):
    return Client()


def htmx(target: str | None = None, **headers) -> dict:
    """The headers htmx sends: HX-Request, and HX-Target (the id of the element the answer replaces)."""
    sent = {"HX-Request": "true", "HX-Current-URL": "http://testserver/runs/"}
    if target:
        sent["HX-Target"] = target
    sent.update(headers)
    return sent

"""Login throttling (issue 24, section 2): after PAL_LOGIN_FAILURE_LIMIT failures for a user name, or from an
address, logins are refused with 429 for a while, logged, shown on /ops/, and a superuser unlocks from the admin.
Bad API tokens count per address the same way: 429 with Retry-After, while a good token still works."""

import logging

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client

from tests.api.conftest import API
from tokens.services import token_create

from .conftest import logged_in, make_user

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.AXES_FAILURE_LIMIT = 3


@pytest.fixture
def ops_user(db):
    user = make_user("ops", "runs.view_run", "runs.operate")
    user.set_password("the-right-one")
    user.save()
    return user


def try_login(client: Client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_wrong_passwords_for_one_user_lock_that_user_out_with_429_even_from_another_address(ops_user, caplog):
    caplog.set_level(logging.INFO)
    client = Client()
    for _ in range(2):
        answer = try_login(client, "ops", "guess")
        assert answer.status_code == 200 and "did not match" in answer.content.decode()  # an ordinary failure
    locked = try_login(client, "ops", "guess")  # the third: the limit
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    # Now even the right password, from another address, is refused for the cool-off.
    answer = try_login(Client(), "ops", "the-right-one", address="10.9.9.9")
    assert answer.status_code == 429 and "_auth_user_id" not in answer.client.session
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("axes") and r.levelno >= logging.WARNING]
    assert any("Locking out" in m and "ops" in m for m in logged), logged


def test_failures_from_one_address_lock_the_address_for_every_user_name(ops_user):
    client = Client()
    for name in ("alice", "bob", "carol"):
        try_login(client, name, "guess", address="10.0.0.7")
    assert try_login(client, "ops", "the-right-one", address="10.0.0.7").status_code == 429
    answer = try_login(Client(), "ops", "the-right-one", address="10.0.0.8")  # another address: fine
    assert answer.status_code == 302


def test_ops_shows_the_lockout_and_a_superuser_unlocks_it_in_the_admin(ops_user):
    for _ in range(3):
        try_login(Client(), "ops", "guess")
    page = logged_in(make_user("vera", "runs.view_run")).get("/ops/").content.decode()
    assert 'data-lockout="ops"' in page and "Locked out" in page

    admin = logged_in(User.objects.create_superuser(username="ada", email="ada@example.com"))
    listed = admin.get("/admin/axes/accessattempt/")
    assert listed.status_code == 200 and "ops" in listed.content.decode()
    ids = [str(a.pk) for a in AccessAttempt.objects.all()]
    answer = admin.post(
        "/admin/axes/accessattempt/", {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    )
    assert answer.status_code == 302
    assert try_login(Client(), "ops", "the-right-one").status_code == 302  # unlocked: logged in


def test_a_success_before_the_limit_resets_the_count(ops_user):
    client = Client()
    for _ in range(2):
        try_login(client, "ops", "guess")
    assert try_login(client, "ops", "the-right-one").status_code == 302
    for _ in range(2):
        assert try_login(Client(), "ops", "guess").status_code == 200  # counted from zero again


def test_bad_api_tokens_from_one_address_get_429_while_a_good_token_still_works(db):
    good = token_create(user=make_user("vera", "runs.view_run"), name="t")[1]
    client = Client()
    for number in range(1, 4):
        answer = client.get(
            f"{API}/runs", headers={"Authorization": f"Bearer pal_guess{number}"}, REMOTE_ADDR="10.1.1.1"
        )
        if number < 3:
            assert answer.status_code == 401, answer.content
    assert answer.status_code == 429, answer.content
    assert answer.json()["code"] == "too_many_bad_tokens" and int(answer["Retry-After"]) > 0
    assert (
        client.get(f"{API}/runs", headers={"Authorization": f"Bearer {good}"}, REMOTE_ADDR="10.1.1.1").status_code
        == 200
    )
    other = client.get(f"{API}/runs", headers={"Authorization": "Bearer pal_guess"}, REMOTE_ADDR="10.1.1.2")
    assert other.status_code == 401  # another address has its own count
    page = logged_in(make_user("otto", "runs.view_run")).get("/ops/").content.decode()
    assert 'data-lockout="10.1.1.1"' in page and "api token" in page

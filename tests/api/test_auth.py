"""Tokens and roles: no token 401, a token without the role 403, viewers read, operators change state."""

import io
import uuid
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import RequestFactory
from django.utils import timezone

from tokens.admin import ApiTokenAdmin
from tokens.models import ApiToken
from tokens.services import token_authenticate, token_hash

from .conftest import Api, assert_error, make_user, token_for

RUN = uuid.uuid4()
READS = [
    "/workflows",
    "/workflows/anything",
    "/runs",
    f"/runs/{RUN}",
    f"/runs/{RUN}/events",
    f"/runs/{RUN}/events/stream",
    f"/runs/{RUN}/waterfall",
    f"/runs/{RUN}/receipt",
    f"/runs/{RUN}/redrive/preview",
]
WRITES = [
    ("/workflows", {"name": "w", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo"}]}),
    ("/runs", {"workflow": "w"}),
    (f"/runs/{RUN}/events", {"kind": "note", "payload": {}}),
    (f"/runs/{RUN}/redrive", {"reason": "r"}),
    (f"/runs/{RUN}/cancel", {"reason": "r"}),
    (f"/runs/{RUN}/retry", {"reason": "r"}),
    (f"/runs/{RUN}/approvals/review", {"approved": True, "comment": ""}),
    (f"/runs/{RUN}/signals/ci-done", {"payload": {}}),
]


@pytest.mark.parametrize("path", READS)
def test_a_read_without_a_token_is_401(anonymous, path):
    response = anonymous.get(path)
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("path,body", WRITES)
def test_a_write_without_a_token_is_401(anonymous, path, body):
    assert_error(anonymous.post(path, body), 401, "not_authenticated")


@pytest.mark.parametrize("path", READS)
def test_a_token_without_a_role_cannot_read(nobody, path):
    assert_error(nobody.get(path), 403, "forbidden")


@pytest.mark.parametrize("path", READS)
def test_a_viewer_reads(viewer, path):
    assert viewer.get(path).status_code in (200, 404)


@pytest.mark.parametrize("path,body", WRITES)
def test_a_viewer_cannot_write(viewer, path, body):
    body = assert_error(viewer.post(path, body), 403, "forbidden")
    assert "runs.operate" in body["detail"]


@pytest.mark.parametrize("path,body", WRITES)
def test_an_operator_writes(operator, path, body):
    assert operator.post(path, body).status_code not in (401, 403)


@pytest.mark.parametrize("path", READS)
def test_an_operator_reads_even_without_the_view_permission(db, path):
    api = Api(token_for(make_user("op", "runs.operate")))
    assert api.get(path).status_code in (200, 404)


@pytest.mark.parametrize("path,body", WRITES)
def test_a_superuser_is_both(superuser, path, body):
    assert superuser.post(path, body).status_code not in (401, 403)
    assert superuser.get("/runs").status_code == 200


def test_an_unknown_token_is_401(db):
    assert_error(Api("pal_not-a-real-token").get("/runs"), 401, "not_authenticated")


def test_another_scheme_is_401(viewer):
    response = viewer.client.get("/api/v1/runs", headers={"Authorization": f"Basic {viewer.token}"})
    assert_error(response, 401)


def test_a_revoked_token_is_401(viewer):
    ApiToken.objects.update(revoked_at=timezone.now())
    assert_error(viewer.get("/runs"), 401, "not_authenticated")


def test_the_token_of_an_inactive_user_is_401(viewer):
    ApiToken.objects.get().user.__class__.objects.update(is_active=False)
    assert_error(viewer.get("/runs"), 401)


def test_only_the_hash_of_a_token_is_stored(viewer):
    row = ApiToken.objects.get()
    assert row.token_hash == token_hash(viewer.token)
    assert viewer.token not in str(ApiToken.objects.values().get())
    assert viewer.token.startswith(row.prefix)


def test_a_call_notes_when_the_token_was_last_used(viewer):
    assert ApiToken.objects.get().last_used_at is None
    viewer.get("/runs")
    first = ApiToken.objects.get().last_used_at
    assert first is not None
    viewer.get("/runs")  # within the minute: no second write
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=timezone.now() - timedelta(minutes=5))
    viewer.get("/runs")
    assert ApiToken.objects.get().last_used_at > first


def _last_used_seconds_ago(seconds: int) -> None:
    """Set the token's last use `seconds` before now by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE api_tokens SET last_used_at = statement_timestamp() - %s * interval '1 second'", [seconds]
        )


def test_a_tokens_last_use_is_stamped_again_only_a_minute_after_the_last_stamp_by_the_databases_clock(viewer):
    viewer.get("/runs")
    _last_used_seconds_ago(45)
    kept = ApiToken.objects.get().last_used_at
    viewer.get("/runs")
    assert ApiToken.objects.get().last_used_at == kept  # 45 s ago: within the minute, not written
    _last_used_seconds_ago(75)
    viewer.get("/runs")
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp() - last_used_at FROM api_tokens")
        (since,) = cursor.fetchone()
    assert since < timedelta(seconds=30)  # written again, with the database's now()


def test_pal_token_prints_a_new_token_alone_on_its_last_line(db):
    make_user("alice", "runs.view_run")
    out = io.StringIO()
    call_command("pal_token", "alice", "--name", "ci", stdout=out)
    token = out.getvalue().rstrip("\n").splitlines()[-1]
    assert token.startswith("pal_") and " " not in token
    assert token_authenticate(token).username == "alice"
    assert ApiToken.objects.get().name == "ci"
    assert Api(token).get("/runs").status_code == 200


def test_pal_token_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("pal_token", "ghost", stdout=io.StringIO())


def test_the_admin_lists_tokens_and_revokes_them(admin_client, viewer):
    page = admin_client.get("/admin/tokens/apitoken/")
    assert page.status_code == 200
    row = ApiToken.objects.get()
    assert row.prefix in page.content.decode()
    assert row.token_hash not in page.content.decode()
    response = admin_client.post(
        "/admin/tokens/apitoken/", {"action": "revoke_tokens", "_selected_action": [row.pk]}, follow=True
    )
    assert response.status_code == 200
    assert ApiToken.objects.get().revoked_at is not None
    assert_error(viewer.get("/runs"), 401)


def test_tokens_are_not_created_or_edited_in_the_admin(db):
    request = RequestFactory().get("/admin/")
    model_admin = ApiTokenAdmin(ApiToken, admin.site)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)


def test_pal_token_expires_makes_a_token_refused_once_its_time_has_passed(db):
    make_user("alice", "runs.view_run")
    out = io.StringIO()
    call_command("pal_token", "alice", "--expires", "30d", stdout=out)
    token = out.getvalue().rstrip("\n").splitlines()[-1]
    row = ApiToken.objects.get()
    assert timedelta(days=29, hours=23) < row.expires_at - timezone.now() <= timedelta(days=30)
    assert "expiring" in out.getvalue()
    assert Api(token).get("/runs").status_code == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # its 30 days have passed
    body = assert_error(Api(token).get("/runs"), 401, "not_authenticated")
    assert "expired" in body["detail"]
    assert not ApiToken.objects.get().is_active


@pytest.mark.parametrize("text", ["30", "0d", "1y", "-3d", "3.5h", "d"])
def test_pal_token_refuses_a_lifetime_it_cannot_read_naming_the_forms(db, text):
    make_user("alice", "runs.view_run")
    with pytest.raises(CommandError, match=r"--expires: .* a whole number and m, h, d or w"):
        call_command("pal_token", "alice", f"--expires={text}", stdout=io.StringIO())
    assert not ApiToken.objects.exists()


def test_the_admin_shows_when_each_token_was_last_used_and_when_it_expires(admin_client, viewer):
    ApiToken.objects.update(expires_at=timezone.now() + timedelta(days=7))
    viewer.get("/runs")
    page = admin_client.get("/admin/tokens/apitoken/").content.decode()
    assert "column-last_used_at" in page and "column-expires_at" in page
    assert ApiToken.objects.get().last_used_at is not None


def test_a_staff_user_who_may_view_tokens_may_not_revoke_them(client, viewer):
    staff = User.objects.create_user("stan", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    client.force_login(staff)
    assert client.get("/admin/tokens/apitoken/").status_code == 200
    client.post("/admin/tokens/apitoken/", {"action": "revoke_tokens", "_selected_action": [ApiToken.objects.get().pk]})
    assert ApiToken.objects.get().revoked_at is None  # the action is not theirs: nothing was revoked

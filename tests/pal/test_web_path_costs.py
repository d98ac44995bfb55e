"""What pal.web no longer does per request, and what it still does.

- An API call passes by the pages' middlewares (session, CSRF, login, messages, htmx: pal.middleware.PagesOnly):
  it answers with the same headers as through Django's full chain, the security headers among them, and a page
  still gets its session, CSRF cookie and CSRF check.
- A web thread keeps its pooled connection across requests (pal.db_pool): the same backend answers the next
  request, a backend terminated meanwhile is replaced before the next request's first statement, and with a pool
  too small to hold every thread's connection each request gives its connection back, as before.

The app is driven through httpx's ASGI transport on committed rows; the pooled cases run pal.asgi in a child process
with PAL_DB_POOL=1 on the test database (this process's connections are not pooled)."""

import asyncio
import json
import os
import subprocess
import sys

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings

from pal.web import Application
from runs import services
from tests.api.conftest import make_user, token_for
from tests.pal.test_web import FLOW, app  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

# pal.settings.MIDDLEWARE as it was before the pages' middlewares were passed by: Django's own classes.
DJANGO_CHAIN = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "pal.middleware.ApiMiddleware",
    "pal.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
}


def call(application, method: str, path: str, *, sync_path: bool, cookies=None, **kwargs) -> httpx.Response:
    async def go():
        application.sync_path = sync_path
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies=cookies) as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def _with_password(user):
    user.set_password("pw")
    user.save(update_fields=["password"])
    return user


@pytest.fixture
def django_chain_app(app):  # noqa: F811
    with override_settings(MIDDLEWARE=DJANGO_CHAIN, PAL_WEB_THREADS=1):
        application = Application(app.django.__class__())
    yield application
    application.threads.shutdown()


@pytest.fixture
def token():
    return token_for(make_user("wren", superuser=True))


def test_an_api_call_answers_with_the_same_headers_as_through_djangos_full_chain(app, django_chain_app, token):  # noqa: F811
    services.workflow_create(definition=FLOW)
    run, _ = services.run_create(workflow_name="web-flow")
    auth = {"Authorization": f"Bearer {token}"}
    for method, path in [("GET", f"/api/v1/runs/{run.id}"), ("GET", "/api/v1/no-such-call"), ("GET", "/api/v1/runs")]:
        for sync_path in (True, False):
            ours = call(app, method, path, sync_path=sync_path, headers=auth)
            before = call(django_chain_app, method, path, sync_path=sync_path, headers=auth)
            assert (ours.status_code, ours.content) == (before.status_code, before.content), path
            assert ours.headers.multi_items() == before.headers.multi_items(), path
            assert {name: ours.headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS, path
            assert "set-cookie" not in ours.headers and "cookie" not in ours.headers.get("vary", "").lower(), path


def test_a_logged_in_browsers_cookies_do_not_make_an_api_call_authenticated(app):  # noqa: F811
    user = _with_password(make_user("nils", superuser=True))
    page = call(app, "GET", "/accounts/login/", sync_path=True)
    csrf = page.cookies["csrftoken"]
    login = call(
        app,
        "POST",
        "/accounts/login/",
        sync_path=True,
        cookies={"csrftoken": csrf},
        data={"username": user.get_username(), "password": "pw", "csrfmiddlewaretoken": csrf},
    )
    assert login.status_code == 302 and "sessionid" in login.cookies, login.text[:300]
    cookies = {"csrftoken": csrf, "sessionid": login.cookies["sessionid"]}
    assert call(app, "GET", "/runs/", sync_path=True, cookies=cookies).status_code == 200  # the page: logged in
    api = call(app, "GET", "/api/v1/runs", sync_path=True, cookies=cookies)
    assert api.status_code == 401 and api.json()["code"] == "not_authenticated"


def test_a_page_still_gets_its_csrf_cookie_its_check_and_the_security_headers(app):  # noqa: F811
    _with_password(make_user("nina", superuser=True))
    page = call(app, "GET", "/accounts/login/", sync_path=True)
    assert page.status_code == 200 and "csrftoken" in page.cookies
    assert {name: page.headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS
    refused = call(app, "POST", "/accounts/login/", sync_path=True, data={"username": "nina", "password": "pw"})
    assert refused.status_code == 403  # no CSRF token: Django's CSRF check still guards the pages
    assert get_user_model().objects.get(username="nina").last_login is None


# --- a web thread keeps its pooled connection --------------------------------------------------------------

PROBE = """
import asyncio, json, sys, time
import httpx, psycopg
from pal.asgi import application
from django.db import connections

def backend():
    wrapper = connections["default"]
    return wrapper.connection.info.backend_pid if wrapper.connection is not None else None

async def get(path):
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.get(path)
        return response.status_code, response.json()

out = {"keeps": application.threads._initializer is not None}
out["first"] = asyncio.run(get("/api/v1/health"))
out["after_first"] = application.threads.submit(backend).result()
out["second"] = asyncio.run(get("/api/v1/health"))
out["after_second"] = application.threads.submit(backend).result()
if out["after_second"] is not None:
    gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s"
    with psycopg.connect(sys.argv[1], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [out["after_second"]])
        while not admin.execute(gone, [out["after_second"]]).fetchone()[0]:
            time.sleep(0.02)
out["after_terminate"] = asyncio.run(get("/api/v1/health"))
out["after_terminate_backend"] = application.threads.submit(backend).result()
print(json.dumps(out))
"""


def _pooled_app_probe(**env) -> dict:
    assert connection.vendor == "postgresql", "the pool is Postgres's (PAL_DB_POOL)"
    params = connection.get_connection_params()
    url = f"postgres://{params['user']}:{params['password']}@{params['host']}:{params['port']}/{params['dbname']}"
    conninfo = " ".join(f"{key}={params[key]}" for key in ("host", "port", "user", "password")) + " dbname=postgres"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "pal.settings",
        "DATABASE_URL": url,
        "PAL_DB_POOL": "1",
        "PAL_DB_CONN_MAX_AGE": "0",
        "PAL_WEB_THREADS": "1",
        **env,
    }
    done = subprocess.run([sys.executable, "-c", PROBE, conninfo], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_a_web_thread_keeps_its_connection_and_a_terminated_backend_is_replaced_before_the_next_request():
    out = _pooled_app_probe()
    assert out["keeps"]
    for answer in ("first", "second", "after_terminate"):
        status, body = out[answer]
        assert status == 200 and body["database"] == "ok", (answer, body)
    assert out["after_first"] is not None and out["after_first"] == out["after_second"]  # kept, not given back
    assert out["after_terminate_backend"] not in (None, out["after_second"])  # a fresh one, kept in turn


@pytest.mark.integration
def test_with_a_pool_too_small_for_every_thread_each_request_gives_its_connection_back():
    # 1 web thread + the event stream's 4 >= a pool of 5: a kept connection could starve the streams' threads.
    out = _pooled_app_probe(PAL_DB_POOL_SIZE="5")
    assert not out["keeps"]
    for answer in ("first", "second", "after_terminate"):
        status, body = out[answer]
        assert status == 200 and body["database"] == "ok", (answer, body)
    assert out["after_first"] is None and out["after_second"] is None  # given back to the pool at each request's end

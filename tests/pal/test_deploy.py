"""Production settings: `check --deploy` is clean with the TLS-proxy switch on, and the switch does what it says."""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from axes.middleware import AxesMiddleware
from django.conf import settings
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string

ROOT = Path(__file__).resolve().parents[2]


def production_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_DEBUG")}
    env.update(
        PAL_VAR_DIR=str(tmp_path),
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="pal.example.com,.ops.example.com",
        EMAIL_HOST="smtp.example.com",
        PAL_BEHIND_TLS_PROXY="true",
    )
    env.update(extra)
    return env


def check_deploy(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_reports_nothing_with_the_production_switch_on(tmp_path):
    done = check_deploy(production_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_without_the_switch_check_deploy_names_what_plain_http_lacks(tmp_path):
    done = check_deploy(production_env(tmp_path, PAL_BEHIND_TLS_PROXY="false"))
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W010"):
        assert warning in done.stderr + done.stdout, warning


SWITCHED = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
c = Client()
plain = c.get("/runs/", HTTP_HOST="pal.example.com")
health = c.get("/api/v1/health", HTTP_HOST="pal.example.com")
scrape = c.get("/metrics", HTTP_HOST="pal.example.com")
proxied = c.get("/accounts/login/", HTTP_HOST="pal.example.com", HTTP_X_FORWARDED_PROTO="https")
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")],
    "health": health.status_code,
    "scrape": scrape.status_code,
    "proxied": [proxied.status_code, proxied.get("Strict-Transport-Security", ""),
                proxied.get("Content-Security-Policy", "")],
    "trusted": settings.CSRF_TRUSTED_ORIGINS,
    "cookies": [settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE],
}))
"""


def test_the_switch_redirects_plain_http_but_probes_and_trusts_the_allowed_hosts(tmp_path):
    env = production_env(tmp_path, DJANGO_SETTINGS_MODULE="pal.settings")
    done = subprocess.run(
        [sys.executable, "-c", SWITCHED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["plain"] == [301, "https://pal.example.com/runs/"]
    # A probe and a scrape on the app's own port are answered (the probe: 503 here, with no broker), not sent to https.
    assert seen["health"] in (200, 503) and seen["scrape"] in (200, 401, 403)
    status, hsts, csp = seen["proxied"]
    assert status == 200
    assert hsts == "max-age=31536000; includeSubDomains; preload"
    assert "frame-ancestors 'none'" in csp
    assert seen["trusted"] == ["https://pal.example.com", "https://*.ops.example.com"]
    assert seen["cookies"] == [True, True]


def test_the_silenced_middleware_checks_name_subclasses_of_the_middleware_they_look_for():
    chain = [import_string(path) for path in settings.MIDDLEWARE]
    assert any(issubclass(m, CsrfViewMiddleware) for m in chain)
    assert any(issubclass(m, AxesMiddleware) for m in chain)
    assert set(settings.SILENCED_SYSTEM_CHECKS) == {"axes.W002", "security.W003"}

"""PAL_AGENT_ENV: the names of the worker's variables an agent also gets (docs/reference/keys.md, issue 10 section 3).
A bad value or an engine secret among the names stops start-up naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_django(code: str = "", **env):
    """Import the settings in a fresh interpreter, as a worker would, then run code."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAL_", "DJANGO_", "EMAIL_"))}
    clean.update(DJANGO_SETTINGS_MODULE="pal.settings", PAL_VAR_DIR="/tmp/pal-settings-test", **env)
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "secret",
    [
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "DJANGO_SECRET_KEY",
        "PAL_RECEIPT_PRIVATE_KEY",
        "PAL_RECEIPT_PRIVATE_KEY_FILE",
        "PAL_LLM_API_KEY",
        "PAL_WEBHOOK_SECRET",
        "EMAIL_HOST_PASSWORD",
    ],
)
def test_naming_an_engine_secret_in_pal_agent_env_stops_start_up_naming_both(secret):
    result = start_django(PAL_AGENT_ENV=f"AGENT_TOKEN, {secret}")

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"PAL_AGENT_ENV names {secret}" in result.stderr
    assert "secret of the engine" in result.stderr


def test_a_name_that_is_not_a_variable_name_stops_start_up_naming_it():
    result = start_django(PAL_AGENT_ENV="AGENT_TOKEN,not-a-name")

    assert result.returncode != 0
    assert "PAL_AGENT_ENV must be a comma-separated list of variable names" in result.stderr
    assert "'not-a-name'" in result.stderr


def test_good_names_start_and_are_read_as_a_list():
    result = start_django(
        "from django.conf import settings; print(settings.PAL_AGENT_ENV)", PAL_AGENT_ENV=" AGENT_TOKEN , HTTP_PROXY,,"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['AGENT_TOKEN', 'HTTP_PROXY']"

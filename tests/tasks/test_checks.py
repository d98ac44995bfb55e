"""`manage.py check` for PalBackend: the TASKS entry (offline, in every check, errors), the broker and the
migrations (tagged database and pal: only with --database, --tag pal or migrate, warnings), each with a hint,
against the real broker and database of the test."""

import os
import subprocess
import sys

import pytest
from django.core import checks
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings

PAL = "pal.tasks.PalBackend"
pytestmark = pytest.mark.django_db  # some of the project's own checks read the database


def ids(tags=None, databases=None) -> list[str]:
    return [m.id for m in checks.run_checks(tags=tags, databases=databases) if m.id and m.id.startswith("pal.")]


def test_the_project_settings_pass_the_offline_checks():
    assert ids() == []


def test_options_that_palbackend_does_not_take_are_an_error():
    with override_settings(TASKS={"default": {"BACKEND": PAL, "OPTIONS": {"retries": 3}}}):
        (error,) = [m for m in checks.run_checks() if m.id == "pal.E001"]
    assert "retries" in error.msg and error.hint


def test_queues_other_than_default_are_an_error():
    with override_settings(TASKS={"default": {"BACKEND": PAL, "QUEUES": ["default", "emails"]}}):
        (error,) = [m for m in checks.run_checks() if m.id == "pal.E002"]
    assert "emails" in error.msg and error.hint


def test_palbackend_without_the_runs_app_is_an_error():
    with override_settings(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
        TASKS={"default": {"BACKEND": PAL}},
    ):
        assert "pal.E003" in ids()


def test_network_checks_stay_out_of_a_plain_check():
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0"):
        assert "pal.W010" not in ids()  # plain `check`: offline


@pytest.mark.integration
def test_a_broker_that_answers_and_applied_migrations_pass():
    assert ids(tags=["pal"], databases=["default"]) == []


@pytest.mark.integration
def test_a_broker_that_does_not_answer_is_an_error():
    with override_settings(CELERY_BROKER_URL="redis://:secret-pw@127.0.0.1:1/0"):
        errors = [m for m in checks.run_checks(databases=["default"]) if m.id == "pal.W010"]
    (error,) = errors
    assert "127.0.0.1:1" in error.msg and "secret-pw" not in error.msg and error.hint


@pytest.mark.integration
def test_an_unapplied_migration_of_runs_is_a_warning():
    newest = MigrationRecorder.Migration.objects.filter(app="runs").order_by("-applied", "-id").first()
    newest.delete()  # the test's transaction puts it back
    errors = [m for m in checks.run_checks(tags=["pal"], databases=["default"]) if m.id == "pal.W011"]
    (error,) = errors
    assert f"runs.{newest.name}" in error.msg and "migrate" in error.hint


def test_migrate_of_a_new_database_runs_past_the_network_checks(tmp_path):
    # migrate runs the database-tagged checks (Django passes it the database): the migrations it is about to apply
    # are a warning there, never a reason to stop.
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(PAL_VAR_DIR=str(tmp_path), DJANGO_SECRET_KEY="t")
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SystemCheckError" not in done.stderr

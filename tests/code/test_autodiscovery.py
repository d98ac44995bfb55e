"""An installed app's workflows.py is imported at start-up (found as admin.py is), with no PAL_WORKFLOW_MODULES:
a new process under settings that install tests.apps.billing knows its workflow; one without that app does not."""

import json
import os
import subprocess

from tests.support.workers import REPO_ROOT, python_executable

LIST = (
    "import django, json; django.setup(); from runs.code import WORKFLOWS; "
    "print(json.dumps({name: code.path for name, code in WORKFLOWS.items()}))"
)


def workflows_at_start_up(settings_module: str) -> dict[str, str]:
    """The Python workflows a new process registers under these settings, by name: their functions' paths."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module, "PAL_WORKFLOW_MODULES": ""}
    env.setdefault("DJANGO_SECRET_KEY", "test-only-insecure-key")
    done = subprocess.run(
        [python_executable(), "-c", LIST],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_installed_apps_workflows_module_is_imported_at_start_up():
    found = workflows_at_start_up("tests.apps.settings")
    assert found["billing-refund"] == "tests.apps.billing.workflows.billing_refund", found


def test_a_workflows_module_of_an_app_that_is_not_installed_is_not_imported():
    assert "billing-refund" not in workflows_at_start_up("pal.settings")

"""A Python workflow's code changed for real under a live run, on real workers: the run parks on an approval, the
module file is rewritten so its steps come in another order and the workers restart on it; once the approval is
decided, the replay asks for another step than the journal holds, so the run parks on nondeterminism and nothing
is called; `manage.py pal_check_workflows` in a new process with the new module names the run and the step."""

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from runs import code as registry
from runs.models import Run, RunStatus
from runs.services import approval_decide
from tests.helpers import QUICK, describe, events, wait_until
from tests.support.workers import REPO_ROOT, python_executable

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODULE = "changing_flow"

HEAD = """
import json
import os

from pal.workflows import current_step, step, workflow


def called(name):
    with open(os.environ["PAL_TEST_CALLS_FILE"], "a") as out:
        out.write(json.dumps({"fn": name, "key": current_step().key}) + "\\n")


@step
def fetch(n: int) -> int:
    called("fetch")
    return n + 1


@step
def send(n: int) -> int:
    called("send")
    return n * 2
"""

BEFORE = """
@workflow(name="py-changing")
def py_changing(ctx, input):
    got = fetch(input["n"])
    decision = ctx.approval(f"Send {got}?")
    return {"sent": send(got), "approved": decision["approved"]}
"""

AFTER = """
@workflow(name="py-changing")
def py_changing(ctx, input):
    sent = send(input["n"])  # the deploy sends first now
    decision = ctx.approval(f"Fetch for {sent}?")
    return {"got": fetch(sent), "approved": decision["approved"]}
"""


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A folder on the path holding the workflow's module; the registry as it was once the test is over."""
    folder = tmp_path / "mods"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    workflows, steps = dict(registry.WORKFLOWS), dict(registry.STEPS)
    yield folder
    sys.modules.pop(MODULE, None)
    registry.WORKFLOWS.clear()
    registry.WORKFLOWS.update(workflows)
    registry.STEPS.clear()
    registry.STEPS.update(steps)


def write_module(folder, body: str) -> None:
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)  # a bytecode cache of the old source is never read


def called(calls_file) -> list[str]:
    if not calls_file.exists():
        return []
    return [json.loads(line)["fn"] for line in calls_file.read_text().splitlines()]


def test_a_changed_function_parks_its_live_run_on_nondeterminism_and_the_check_names_it(
    celery_workers, worker_env, module_dir, tmp_path
):
    calls_file = tmp_path / "calls.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join([str(module_dir), str(REPO_ROOT)]),
        "PAL_WORKFLOW_MODULES": MODULE,
        "PAL_TEST_CALLS_FILE": str(calls_file),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    write_module(module_dir, BEFORE)
    handle = importlib.import_module(MODULE).py_changing
    worker = celery_workers(env, name="before", **QUICK)
    run = Run.objects.get(id=handle.start({"n": 3}))
    first_version = run.workflow.definition["code_version"]

    def parked_on(kind):
        run.refresh_from_db()
        return run.status == RunStatus.WAITING and (run.waiting_on or {}).get("kind") == kind

    wait_until(
        lambda: parked_on("approval"), timeout=60, what="the run to park on its approval", explain=lambda: describe(run)
    )
    assert called(calls_file) == ["fetch"]

    # The deploy: the module changes on disk and the workers restart on it.
    worker.kill()
    write_module(module_dir, AFTER)
    celery_workers(env, name="after", **QUICK)
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")

    wait_until(
        lambda: parked_on("nondeterminism"),
        timeout=60,
        what="the run to park on nondeterminism",
        explain=lambda: describe(run),
    )
    assert run.waiting_on == {
        "kind": "nondeterminism",
        "journal": {"step_id": "fetch", "kind": "python"},
        "code": {"step_id": "send", "kind": "python"},
    }
    assert called(calls_file) == ["fetch"]  # nothing was called: not send, not fetch again
    assert [e.step_id for e in events(run, "step_started")] == ["fetch", "approval"]
    assert run.workflow.definition["code_version"] == first_version  # the run keeps the version it started on

    check = subprocess.run(
        [python_executable(), "manage.py", "pal_check_workflows", "py-changing"],
        cwd=REPO_ROOT,
        env={**os.environ, **worker_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 1, (check.stdout, check.stderr)
    assert check.stdout.splitlines() == [
        f"{run.id} py-changing: the journal holds fetch (python) where the code asks send (python)"
    ], check.stdout
    assert "1 of 1 runs checked are live and would diverge" in check.stderr
    assert called(calls_file) == ["fetch"]  # the check called nothing either

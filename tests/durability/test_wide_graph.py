"""A graph of 9,400+ independent steps on a real worker and Postgres (issue 23, section 1): their step_started in one
commit passed psycopg's 65,535 parameters a statement, and the run wedged; the journal append now goes in chunks."""

import time
import uuid

import pytest

from runs.models import RunStatus
from runs.services import run_create, workflow_create
from tests.helpers import QUICK, describe, echo, events, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_graph_of_9500_independent_steps_succeeds(celery_workers):
    celery_workers(name="wide", **QUICK)
    name = f"wide-{uuid.uuid4().hex[:10]}"
    workflow_create(definition={"name": name, "steps": [{**echo(f"s{n}", n=n), "needs": []} for n in range(9500)]})
    began = time.monotonic()
    run, _ = run_create(workflow_name=name, input={})

    run = wait_for_end(run, timeout=180)

    print(f"9,500 independent steps: {time.monotonic() - began:.1f} s on one worker")
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert len(events(run, "step_completed")) == 9500
    assert not events(run, "run_redriven")

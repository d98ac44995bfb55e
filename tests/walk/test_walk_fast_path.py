"""A walk as a worker runs it (autocommit, no debug cursor: the journal's kept cursor, runs.secrets' settings read
once): every step's outcome committed before the next step starts, a chain that verifies to the run's head, and
secrets masked in what the steps were sent and what they returned."""

import json

import pytest
from django.db import connection

from journal.chain import chain_verify
from journal.models import JournalEvent
from runs.models import RunStatus
from runs.secrets import REDACTED
from runs.steps.tools import tool
from tests.helpers import drive_to_end, make_run, step_events, tool_step

# Postgres only: the kept cursor is Postgres's path, and the look from another connection needs a server.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LEAKED = "hook-secret-leaked-654321"


@tool("test_committed_so_far")
def committed_so_far(args, ctx):
    """The step_completed rows another connection sees while this step runs: what a crash now would leave."""
    from psycopg import connect

    settings = connection.settings_dict
    dsn = f"host={settings['HOST']} port={settings['PORT']} dbname={settings['NAME']} user={settings['USER']}"
    with connect(dsn, password=settings["PASSWORD"]) as other:
        (count,) = other.execute(
            "SELECT count(*) FROM journal_events WHERE run_id = %s AND kind = 'step_completed'", [ctx.run_id]
        ).fetchone()
    return {"completed": count}


def test_a_walk_commits_each_outcome_first_chains_to_its_head_and_masks_secrets(settings):
    assert connection.vendor == "postgresql", "this test needs DATABASE_URL on Postgres"
    settings.PAL_WEBHOOK_SECRET = LEAKED
    steps = [
        tool_step("one", "echo", {"api_key": "abc", "note": f"the key is {LEAKED}"}),
        *(tool_step(f"look{n}", "test_committed_so_far") for n in range(3)),
    ]
    run = make_run(steps=steps)

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    looked = [event.payload["output"]["completed"] for event in step_events(run, "step_completed")[1:]]
    assert looked == [1, 2, 3]  # each step saw every earlier step's outcome committed
    sent = step_events(run, "step_started", "one")[0].payload["input"]["args"]
    assert sent == {"api_key": REDACTED, "note": f"the key is {REDACTED}"}
    returned = step_events(run, "step_completed", "one")[0].payload["output"]
    assert returned == {"api_key": "abc", "note": f"the key is {REDACTED}"}  # an output is masked, its keys kept
    assert LEAKED not in json.dumps([row.payload for row in JournalEvent.objects.filter(run_id=run.id)])
    report = chain_verify(run_id=run.id, expect_head=(run.journal_head_seq, run.journal_head_hash))
    assert report.ok, report.reason

"""agent: an in-VM agent run as a subprocess (issue 3, docs/reference/workflows.md, keys.md), driven inline.

The agent is the repo's example (agents/example_agent.py, configured as "coder"). It gets the variables of the
driving process's environment that PAL_AGENT_ENV names, so PAL_AGENT_RECORD set and named here makes it append
what it saw to a file.
"""

import json
import os
import sys

import pytest

from journal.services import NewEvent
from runs import leases
from runs.models import RunStatus
from runs.services import workflow_create
from runs.workflows import WorkflowInvalid
from tests.helpers import drive, events, journal_by_hand, kinds, make_run, step_events

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet_heartbeat(monkeypatch):
    """The heartbeat thread has its own connection, which cannot see this test's uncommitted lease rows: left
    alone it would find every lease gone at its next beat. Here it reports every held lease as still held."""
    monkeypatch.setattr(leases, "lease_heartbeat", lambda owner=None: [str(r) for r in list(leases.heartbeat._held)])


@pytest.fixture
def record(tmp_path, monkeypatch, settings):
    """The file the example agent appends what it saw to; returns a function reading its lines."""
    path = tmp_path / "agent-record.jsonl"
    monkeypatch.setenv("PAL_AGENT_RECORD", str(path))
    settings.PAL_AGENT_ENV = ["PAL_AGENT_RECORD"]

    def lines():
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return lines


def agent_step(step_id="code", **input) -> dict:
    return {"id": step_id, "kind": "agent", "agent": "coder", "input": input}


def python_agent(code: str) -> list[str]:
    """A one-line agent: reads its stdin, runs code (json and os imported), prints {"ok": true}."""
    return [sys.executable, "-c", f"import json, os, sys; sys.stdin.read(); {code}; print(json.dumps({{'ok': True}}))"]


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# --- a good run -----------------------------------------------------------------------------------


def test_the_agents_output_is_the_json_object_it_prints_on_stdout(record):
    run = make_run(steps=[agent_step(task="{{ input.ticket }}")], input={"ticket": "fix the login"})

    drive(run)

    assert run.status == RunStatus.SUCCEEDED
    expected = {"result": "done: fix the login", "resumed": False, "key": f"{run.id}:code:1"}
    assert step_events(run, "step_completed", "code")[0].payload["output"] == expected
    assert run.output == expected


def test_the_agent_gets_the_run_the_step_and_the_key_run_step_attempt_in_its_environment(record):
    run = make_run(steps=[agent_step(task="x")])

    drive(run)

    (seen,) = record()
    assert seen["run_id"] == str(run.id)
    assert seen["step_id"] == "code"
    assert seen["key"] == f"{run.id}:code:1"


def test_a_first_run_of_an_agent_does_not_get_pal_resume(record):
    run = make_run(steps=[agent_step(task="x")])

    drive(run)

    (seen,) = record()
    assert seen["resume"] is False


def test_pal_resume_in_the_workers_own_environment_does_not_leak_into_a_first_run(record, monkeypatch):
    monkeypatch.setenv("PAL_RESUME", "1")
    run = make_run(steps=[agent_step(task="x")])

    drive(run)

    (seen,) = record()
    assert seen["resume"] is False


def test_an_agent_whose_attempt_started_before_a_crash_gets_pal_resume_and_the_same_key(record):
    run = make_run(steps=[agent_step(task="x")])
    # What a worker that died while the agent ran leaves behind: the attempt's step_started, no outcome.
    journal_by_hand(
        run, NewEvent("run_started"), NewEvent("step_started", "code", 1, {"key": f"{run.id}:code:1", "kind": "agent"})
    )

    drive(run)

    (seen,) = record()
    assert seen["resume"] is True
    assert seen["key"] == f"{run.id}:code:1"
    assert run.output["resumed"] is True


def test_the_agent_does_not_get_the_engines_secrets(record, settings, monkeypatch, tmp_path):
    monkeypatch.setenv("PAL_LLM_API_KEY", "sk-engine-only")
    monkeypatch.setenv("PAL_WEBHOOK_SECRET", "hook-secret")
    dump = tmp_path / "env.json"
    settings.PAL_AGENTS = {"envdump": python_agent(f"open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))")}
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "envdump", "input": {}}])

    drive(run)

    assert run.output == {"ok": True}
    names = set(json.loads(dump.read_text()))
    assert "PAL_RUN_ID" in names
    assert not names & {"PAL_LLM_API_KEY", "PAL_WEBHOOK_SECRET", "DJANGO_SECRET_KEY"}


ENGINE_SECRETS = {
    "DATABASE_URL": "postgres://pal:db-password-123@127.0.0.1:5432/pal",
    "CELERY_BROKER_URL": "redis://:broker-password-123@127.0.0.1:6379/0",
    "DJANGO_SECRET_KEY": "django-secret-key-123456",
    "PAL_RECEIPT_PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----",
    "PAL_RECEIPT_PRIVATE_KEY_FILE": "/etc/pal/receipt-key.pem",
    "PAL_LLM_API_KEY": "sk-provider-key-123456",
    "PAL_WEBHOOK_SECRET": "webhook-secret-123456",
    "EMAIL_HOST_PASSWORD": "smtp-password-123456",
}


def env_dump_agent(settings, tmp_path):
    """Configures the agent "envdump", which writes its whole environment to a JSON file; returns a reader."""
    dump = tmp_path / "env.json"
    settings.PAL_AGENTS = {"envdump": python_agent(f"open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))")}
    return lambda: json.loads(dump.read_text())


def test_the_agents_environment_is_the_allowlist_and_what_pal_agent_env_names(settings, monkeypatch, tmp_path):
    for name, value in ENGINE_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AGENT_TOKEN", "the agent's own credential")
    monkeypatch.setenv("UNNAMED_VARIABLE", "not for agents")
    settings.PAL_AGENT_ENV = ["AGENT_TOKEN", "NAMED_BUT_NOT_SET"]
    seen = env_dump_agent(settings, tmp_path)
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "envdump", "input": {}}])

    drive(run)

    assert run.output == {"ok": True}
    env = seen()
    base = {name for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    # LC_CTYPE: Python itself may add it in the child (PEP 538 locale coercion) when no locale is set.
    assert set(env) - {"LC_CTYPE"} == base | {"PAL_RUN_ID", "PAL_STEP_ID", "PAL_IDEMPOTENCY_KEY", "AGENT_TOKEN"}
    assert env["AGENT_TOKEN"] == "the agent's own credential"
    assert env["PAL_IDEMPOTENCY_KEY"] == f"{run.id}:code:1"
    assert not set(env) & set(ENGINE_SECRETS)
    assert not any(value in json.dumps(env) for value in ENGINE_SECRETS.values())


def test_an_engine_secret_named_in_pal_agent_env_still_never_reaches_the_agent(settings, monkeypatch, tmp_path):
    # Start-up refuses such a PAL_AGENT_ENV (tests/pal/test_agent_env_setting.py); this is the step's own guard.
    for name, value in ENGINE_SECRETS.items():
        monkeypatch.setenv(name, value)
    settings.PAL_AGENT_ENV = list(ENGINE_SECRETS)
    seen = env_dump_agent(settings, tmp_path)
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "envdump", "input": {}}])

    drive(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not set(seen()) & set(ENGINE_SECRETS)


# --- masking --------------------------------------------------------------------------------------

LEAKED = "sk-leaked-provider-key-123456"

LEAKY_AGENT = (
    "secret = os.environ['AGENT_COPY']; "
    "print(json.dumps({'pal_event': 'secret_seen', 'value': secret, 'nested': [{'text': 'key=' + secret}]}), "
    "file=sys.stderr, flush=True); "
    "print('stderr says ' + secret, file=sys.stderr, flush=True); "
    "code = json.loads(sys.stdin.read()).get('exit', 0); "
    "print(json.dumps({'echo': secret, 'text': 'the key is ' + secret})); "
    "sys.exit(code)"
)


@pytest.fixture
def leaky_agent(settings, monkeypatch):
    """An agent that got hold of the configured provider key (as its own copy) and prints it everywhere."""
    settings.PAL_LLM_API_KEY = LEAKED
    monkeypatch.setenv("AGENT_COPY", LEAKED)
    settings.PAL_AGENT_ENV = ["AGENT_COPY"]
    settings.PAL_AGENTS = {"leaky": [sys.executable, "-c", f"import json, os, sys; {LEAKY_AGENT}"]}


def journal_text(run) -> str:
    return json.dumps([[e.kind, e.payload] for e in events(run)])


def test_a_secret_an_agent_prints_on_stdout_and_emits_is_journaled_redacted(leaky_agent):
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "leaky", "input": {}}])

    drive(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert LEAKED not in journal_text(run)
    assert run.output == {"echo": "[redacted]", "text": "the key is [redacted]"}
    (completed,) = step_events(run, "step_completed", "code")
    assert completed.payload["output"] == run.output
    (event,) = step_events(run, "secret_seen", "code")
    assert event.payload == {"value": "[redacted]", "nested": [{"text": "key=[redacted]"}]}


def test_a_secret_in_a_failed_agents_stderr_tail_is_journaled_redacted(leaky_agent):
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "leaky", "input": {"exit": 4}}])

    drive(run)

    assert run.status == RunStatus.FAILED
    assert LEAKED not in journal_text(run)
    assert LEAKED not in json.dumps(run.error)
    (failed,) = step_events(run, "step_failed", "code")
    assert failed.payload["code"] == "agent_failed"
    assert "stderr says [redacted]" in failed.payload["details"]["stderr"]


# --- events on stderr -----------------------------------------------------------------------------


def test_a_pal_event_line_on_stderr_becomes_a_journal_event_of_that_kind(record):
    run = make_run(steps=[agent_step(task="triage")])

    drive(run)

    (event,) = step_events(run, "confidence_evaluated")
    assert (event.step_id, event.attempt) == ("code", 1)
    assert event.payload == {"confidence": 0.92, "task": "triage"}
    code = [e.kind for e in events(run) if e.step_id == "code"]
    assert code == ["step_started", "confidence_evaluated", "step_completed"]


def test_a_reserved_kind_from_an_agent_is_refused_and_journaled_as_refused(record):
    run = make_run(steps=[agent_step(mode="reserved", task="x")])

    drive(run)

    (refused,) = step_events(run, "agent_event_refused")
    assert refused.step_id == "code"
    assert refused.payload["kind"] == "run_succeeded"
    assert "reserved" in refused.payload["reason"]


def test_a_forged_run_succeeded_never_reaches_the_journal_before_the_real_end(record):
    run = make_run(steps=[agent_step(mode="reserved", task="x")])

    drive(run)

    journal = kinds(run)
    assert journal.count("run_succeeded") == 1
    assert journal[-1] == "run_succeeded"
    assert journal.index("agent_event_refused") < journal.index("step_completed")
    assert all(e.payload.get("forged") is None for e in events(run))


# --- failures -------------------------------------------------------------------------------------


def test_an_agent_that_prints_something_other_than_json_fails_the_step_with_agent_bad_output(record):
    run = make_run(steps=[agent_step(mode="garbage")])

    drive(run)

    failed = step_events(run, "step_failed", "code")[0].payload
    assert failed["code"] == "agent_bad_output"
    assert failed["permanent"] is True
    assert failed["details"]["stdout"] == "this is not json"
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "agent_bad_output"


def test_an_agent_that_exits_non_zero_fails_the_step_with_its_exit_status_and_stderr_tail(record):
    run = make_run(steps=[agent_step(mode="fail")])

    drive(run)

    failed = step_events(run, "step_failed", "code")[0].payload
    assert failed["code"] == "agent_failed"
    assert failed["details"]["exit_status"] == 3
    assert "something went wrong" in failed["details"]["stderr"]
    assert "status 3" in failed["message"]
    assert run.status == RunStatus.FAILED


def test_an_agent_that_outlives_its_timeout_fails_the_step_with_agent_timeout(record):
    run = make_run(steps=[{**agent_step(sleep=5), "timeout_seconds": 1}])

    drive(run)

    failed = step_events(run, "step_failed", "code")[0].payload
    assert failed["code"] == "agent_timeout"
    assert "timed out after 1s" in failed["message"]
    assert step_events(run, "step_retrying") == []  # a spent time budget is definite, not an unknown outcome
    assert step_events(run, "step_completed") == []
    assert step_events(run, "confidence_evaluated") == []  # it never got to the end of its sleep
    assert run.status == RunStatus.FAILED


@pytest.mark.parametrize(
    "step",
    [
        # 3 s: the agent (a Python process) must have started and written its record before its timeout
        pytest.param({**agent_step(sleep=5), "timeout_seconds": 3}, id="timeout"),
        pytest.param(agent_step(mode="garbage"), id="bad-output"),
        pytest.param(agent_step(mode="fail"), id="non-zero-exit"),
    ],
)
def test_no_process_of_the_agents_group_is_left_after_a_failed_agent_step(record, step):
    run = make_run(steps=[step])

    drive(run)

    assert run.status == RunStatus.FAILED
    (seen,) = record()
    assert group_is_gone(seen["pid"])  # the agent leads its own group: its pid is the group id


def test_the_agent_runs_in_a_process_group_of_its_own(record, tmp_path, settings):
    groups = tmp_path / "groups.json"
    settings.PAL_AGENTS = {
        "pgid": python_agent(
            f"open({str(groups)!r}, 'w').write(json.dumps({{'pid': os.getpid(), 'pgid': os.getpgid(0)}}))"
        ),
    }
    run = make_run(steps=[{"id": "code", "kind": "agent", "agent": "pgid", "input": {}}])

    drive(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    seen = json.loads(groups.read_text())
    assert seen["pgid"] == seen["pid"]
    assert seen["pgid"] != os.getpgid(0)


def test_a_lease_lost_while_the_agent_runs_kills_its_group_and_stops_the_walk_without_an_outcome(record, monkeypatch):
    # The heartbeat reports the lease gone (stolen or cancelled) once the agent has started.
    monkeypatch.setattr(leases.heartbeat, "lost", lambda fence: bool(record()))
    run = make_run(steps=[agent_step(sleep=5)])

    assert drive(run) == "fenced"

    (seen,) = record()
    assert group_is_gone(seen["pid"])
    assert step_events(run, "step_failed") == []
    assert step_events(run, "step_completed") == []
    assert run.status == RunStatus.RUNNING  # left for whoever holds the lease now


# --- validation -----------------------------------------------------------------------------------


def test_a_workflow_naming_an_unknown_agent_is_refused_naming_the_field():
    with pytest.raises(WorkflowInvalid) as refused:
        workflow_create(
            definition={"name": "agent-typo", "steps": [{"id": "code", "kind": "agent", "agent": "no-such-agent"}]}
        )

    (error,) = refused.value.errors
    assert error["loc"] == "steps[0] (code).agent"
    assert "unknown agent 'no-such-agent'" in error["msg"]
    assert "coder" in error["msg"]  # it says which agents exist

"""An agent run by a real worker gets none of the engine's secrets (issue 10 section 3, docs/reference/keys.md).

The worker process holds DATABASE_URL, CELERY_BROKER_URL, DJANGO_SECRET_KEY, the provider key, the webhook
secret, the SMTP password and the receipt key's path in its environment; the agent prints its environment as
its output, which goes into the journal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runs.models import RunStatus
from tests.helpers import QUICK, describe, events, start_run, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ENV_AGENT = "import json, os, sys; sys.stdin.read(); print(json.dumps({'env': dict(os.environ)}))"


def test_an_agent_on_a_real_worker_sees_only_its_allowlist_never_the_workers_secrets(
    celery_workers, tmp_path, settings
):
    agents = {"envdump": [sys.executable, "-c", ENV_AGENT]}
    settings.PAL_AGENTS = agents  # this process validates the workflow; the worker runs it
    key_file = tmp_path / "receipt-key.pem"
    key_file.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    secrets = {
        "PAL_LLM_API_KEY": "sk-worker-only-123456",
        "PAL_WEBHOOK_SECRET": "webhook-worker-only-123456",
        "EMAIL_HOST_PASSWORD": "smtp-worker-only-123456",
        "PAL_RECEIPT_PRIVATE_KEY_FILE": str(key_file),
    }
    worker = celery_workers(
        {
            **secrets,
            "PAL_AGENTS": json.dumps(agents),
            "PAL_AGENT_ENV": "AGENT_TOKEN",
            "AGENT_TOKEN": "the agent's own token",
        },
        name="agent-env",
        **QUICK,
    )
    worker_env = dict(
        line.split("=", 1) for line in Path(f"/proc/{worker.pid}/environ").read_text().split("\0") if "=" in line
    )
    assert worker_env["DATABASE_URL"].startswith("postgres://")  # the worker has them: the agent must not
    assert {"CELERY_BROKER_URL", "DJANGO_SECRET_KEY", *secrets} <= set(worker_env)

    run = start_run({"id": "code", "kind": "agent", "agent": "envdump", "input": {}})
    run = wait_for_end(run, timeout=60)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    env = run.output["env"]
    assert env["AGENT_TOKEN"] == "the agent's own token"
    assert env["PAL_IDEMPOTENCY_KEY"] == f"{run.id}:code:1"
    forbidden = {
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "DJANGO_SECRET_KEY",
        "PAL_RECEIPT_PRIVATE_KEY",
        "PAL_RECEIPT_PRIVATE_KEY_FILE",
        "PAL_LLM_API_KEY",
        "PAL_WEBHOOK_SECRET",
        "EMAIL_HOST_PASSWORD",
    }
    assert not set(env) & forbidden, sorted(env)
    text = json.dumps([e.payload for e in events(run)])
    for value in (worker_env["DATABASE_URL"], worker_env["CELERY_BROKER_URL"], *secrets.values()):
        assert value not in text

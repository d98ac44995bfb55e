"""PAL_RATE_LIMITS on real workers (issue 14): a fan-out of model calls with requests_per_minute 4 on 2 workers: the
provider sees at most 4 calls in any 60-second window, the run waits (holding no worker) between windows, and every
call is made once."""

import json

import pytest

from runs.models import RunStatus
from tests.helpers import QUICK, describe, start_run, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_provider_never_sees_more_calls_in_a_minute_than_the_limit_allows(celery_workers, llm_provider):
    env = {
        **llm_provider.env(),
        "PAL_RATE_LIMITS": json.dumps({"llm:gpt-4o-mini": {"requests_per_minute": 4}}),
    }
    celery_workers(env, name="rate-a", **QUICK)
    celery_workers(env, name="rate-b", **QUICK)
    step = {"id": "ask", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Q {{ item }}"}
    run = start_run({**step, "for_each": "{{ input.qs }}", "max_concurrency": 8}, input={"qs": list(range(6))})

    run = wait_for_end(run, timeout=150)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    times = sorted(call.received_at for call in llm_provider.calls)
    assert len(times) == 6
    assert max(sum(1 for t in times if start <= t < start + 60) for start in times) <= 4
    assert len({call.idempotency_key for call in llm_provider.calls}) == 6  # each once

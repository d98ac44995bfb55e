"""Traces (CONTRACT section 10): with OTEL_EXPORTER_OTLP_ENDPOINT set, a run made by POST /runs on a real uvicorn
and walked by a real worker is one trace: the request, the Celery task, a span per step attempt with the
contract's attributes, and the provider's HTTP call under its step; received by a local OTLP/HTTP receiver."""

from __future__ import annotations

import time

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from runs.models import Run
from runs.services import approval_decide
from tests.api.conftest import make_user, token_for
from tests.helpers import QUICK, echo, llm, make_workflow, wait_for_end, wait_until
from tests.support import workers as worker_support
from tests.support.web import uvicorn_server

from .otlp import OTLPReceiver, ReceivedSpan


def wait_for_spans(receiver: OTLPReceiver, predicate, *, timeout: float = 30.0) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout
    while True:
        spans = receiver.received()
        if predicate(spans):
            return spans
        if time.monotonic() > deadline:
            names = sorted({f"{s.service}:{s.name}" for s in spans})
            raise AssertionError(f"the spans did not arrive within {timeout}s; got {len(spans)}: {names}")
        time.sleep(0.1)


def ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[ReceivedSpan]:
    chain = []
    while span.parent_span_id and span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_run_is_one_trace_from_the_request_through_the_task_and_its_steps_to_the_provider_call(
    celery_workers, llm_provider, tmp_path
):
    make_workflow(name="traced", steps=[llm("draft", "Summarise {{ input.ticket }}"), echo("lookup", q=1)])
    token = token_for(make_user("otto", "runs.view_run", "runs.operate"))
    with OTLPReceiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second, not five
            **llm_provider.env(),
        }
        celery_workers(env, name="traced", **QUICK)
        database = worker_support.database_url()
        with uvicorn_server(database_url=database, env=env, log_dir=tmp_path / "web") as web:
            created = httpx.post(
                f"{web}/api/v1/runs",
                json={"workflow": "traced", "input": {"ticket": "T-1"}},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert created.status_code == 201, created.text
            run = Run.objects.get(id=created.json()["id"])
            assert wait_for_end(run, timeout=60).status == "succeeded"

            def complete(spans):
                """Every span the assertions read has arrived: the processes export in batches of their own."""
                by_id = {s.span_id: s for s in spans}
                steps = {
                    s.attributes.get("pal.step_id"): s for s in spans if s.attributes.get("pal.run_id") == str(run.id)
                }
                if not {"draft", "lookup"} <= set(steps):
                    return False
                draft = steps["draft"]
                reached_request = any(a.kind == SpanProto.SPAN_KIND_SERVER for a in ancestors(draft, by_id))
                called = any(s.parent_span_id == draft.span_id for s in spans if s.kind == SpanProto.SPAN_KIND_CLIENT)
                queried = any(
                    s.service == "pal-worker"
                    and s.trace_id == draft.trace_id
                    and any(k.startswith("db.") for k in s.attributes)
                    for s in spans
                )
                return reached_request and called and queried

            spans = wait_for_spans(receiver, complete)

    by_id = {s.span_id: s for s in spans}
    steps = {s.attributes["pal.step_id"]: s for s in spans if s.attributes.get("pal.run_id") == str(run.id)}
    assert set(steps) == {"draft", "lookup"}

    # The run records the trace it was made in; every step of it is in that trace.
    traceparent = Run.objects.get(id=run.id).trigger_meta["traceparent"]
    trace_id = traceparent.split("-")[1]
    assert {s.trace_id for s in steps.values()} == {trace_id}

    draft = steps["draft"]
    assert draft.attributes["pal.attempt"] == 1
    assert draft.attributes["pal.key"] == f"{run.id}:draft:1"
    assert draft.attributes["pal.outcome"] == "completed"
    assert draft.attributes["pal.tokens.prompt"] > 0 and draft.attributes["pal.tokens.completion"] > 0
    assert "pal.cost_usd" in draft.attributes
    assert steps["lookup"].attributes["pal.key"] == f"{run.id}:lookup:1"

    # Parents link: the step under the Celery task that drove it, the task under the request that made the run.
    chain = ancestors(draft, by_id)
    assert chain, "the step span has no parent among the received spans"
    assert any(s.service == "pal-worker" and "runs.tasks.drive" in s.name for s in chain)
    request = [s for s in chain if s.kind == SpanProto.SPAN_KIND_SERVER]
    assert request and request[0].service == "pal-web" and request[0].name.startswith("POST")
    assert all(s.trace_id == trace_id for s in chain)

    # The provider call is an HTTP client span under the step that made it (sent from the step's own thread).
    calls = [s for s in spans if s.kind == SpanProto.SPAN_KIND_CLIENT and s.parent_span_id == draft.span_id]
    assert len(calls) == 1 and calls[0].trace_id == trace_id
    assert calls[0].name.startswith("POST")

    # The worker's queries are spans too (psycopg), in the run's trace.
    queries = [s for s in spans if s.service == "pal-worker" and any(k.startswith("db.") for k in s.attributes)]
    assert any(q.trace_id == trace_id for q in queries)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_steps_after_an_approval_stay_in_the_runs_trace_and_link_the_task_that_woke_them(celery_workers, tmp_path):
    make_workflow(
        name="reviewed",
        steps=[echo("before", n=1), {"id": "review", "kind": "approval", "prompt": "ok?"}, echo("after", n=2)],
    )
    token = token_for(make_user("otto", "runs.view_run", "runs.operate"))
    with OTLPReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        celery_workers(env, name="reviewed", **QUICK)
        with uvicorn_server(database_url=worker_support.database_url(), env=env, log_dir=tmp_path / "web") as web:
            created = httpx.post(
                f"{web}/api/v1/runs",
                json={"workflow": "reviewed"},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert created.status_code == 201, created.text
            run = Run.objects.get(id=created.json()["id"])
            wait_until(lambda: Run.objects.get(id=run.id).status == "waiting", timeout=60, what="the run to wait")
            # Decided here, in a process without tracing: the wake-up's task starts a trace of its own.
            approval_decide(run_id=run.id, step_id="review", approved=True, by="otto", comment="")
            assert wait_for_end(run, timeout=60).status == "succeeded"

            def ours(spans):
                return [s for s in spans if s.attributes.get("pal.run_id") == str(run.id)]

            def complete(spans):
                ids = [s.attributes["pal.step_id"] for s in ours(spans)]
                return {"before", "after"} <= set(ids) and ids.count("review") == 2

            spans = wait_for_spans(receiver, complete)

    trace_id = Run.objects.get(id=run.id).trigger_meta["traceparent"].split("-")[1]
    steps = {s.attributes["pal.step_id"]: s for s in ours(spans)}
    assert {s.trace_id for s in steps.values()} == {trace_id}
    after = steps["after"]
    assert after.links, "a step driven by a task of another trace links that task"
    assert all(link_trace != trace_id for link_trace, _ in after.links)
    review = [s for s in ours(spans) if s.attributes["pal.step_id"] == "review"]
    assert sorted(s.attributes["pal.outcome"] for s in review) == ["completed", "waiting"]

"""Traces over OTLP/HTTP (docs/reference/metrics.md), on only when OTEL_EXPORTER_OTLP_ENDPOINT is set; and the two
hooks the walk calls around each step attempt, which also feed the step metrics of pal.meters whether tracing is on
or not."""

# A run is a trace. POST /runs records the request's trace context on the run (trigger_meta.traceparent); the
# Celery instrumentation carries it to the drive task in the message headers; each step attempt is a span
# under the task's span when the task belongs to the run's trace (the run's first task), else directly under the
# run's recorded context with a link to the task that drove it (a slice after a handoff, a re-drive by the sweep,
# a wake-up after an approval). A run with no recorded context (made without tracing) takes its id as trace id.
#
# The provider call and a webhook are httpx requests made in the step's own thread: they carry the attempt's key
# as their Idempotency-Key (docs/reference/keys.md), and the transport wrapper below makes the open span of that key
# their parent, so the HTTP client span sits under its step whichever thread sent it.

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pal import meters

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"

_provider: Any = None  # the SDK's TracerProvider once tracing_setup ran in this process
_tracer: trace.Tracer | None = None
_open: dict[str, trace.Span] = {}  # the open step spans of this process, by attempt key
_open_lock = threading.Lock()
_propagator = TraceContextTextMapPropagator()
_MAX_OPEN = 10_000  # spans of walks that died between begin and settle are dropped past this


def tracing_setup(service_name: str) -> bool:
    """Start tracing in this process (once): the SDK with the OTLP/HTTP exporter and the Django, Celery, httpx and
    psycopg instrumentations. A no-op returning False when OTEL_EXPORTER_OTLP_ENDPOINT is unset. The exporter
    reads the standard OTEL_* variables itself (endpoint, headers, timeout; OTEL_BSP_* for batching)."""
    global _provider, _tracer
    if not os.environ.get(ENDPOINT_VARIABLE, "").strip():
        return False
    if _provider is not None:
        return True
    # The SDK and the instrumentations load only when tracing is on: every process imports this module.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    HTTPXClientInstrumentor().instrument()
    PsycopgInstrumentor().instrument()
    _parent_http_calls_on_their_step()
    _provider, _tracer = provider, provider.get_tracer("pal")
    return True


def tracing_shutdown() -> None:
    """Export what is buffered (a worker child exiting, the end of a test)."""
    if _provider is not None:
        _provider.shutdown()


def _parent_http_calls_on_their_step() -> None:
    """Wrap httpx's transport outside the instrumentation's own wrapper: a request that carries the key of an
    open step span runs with that span as the current one, so the client span the instrumentation starts is its
    child (steps run on threads of their own, where the walk's context is not current)."""
    import wrapt  # a dependency of the instrumentations: there only when tracing is on

    def handle_request(wrapped, instance, args, kwargs):
        request = args[0] if args else kwargs.get("request")
        key = request.headers.get("Idempotency-Key") if request is not None else None
        span = _open.get(key) if key else None
        if span is None:
            return wrapped(*args, **kwargs)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            return wrapped(*args, **kwargs)
        finally:
            otel_context.detach(token)

    wrapt.wrap_function_wrapper("httpx", "HTTPTransport.handle_request", handle_request)


# --- the run's trace ------------------------------------------------------------------------------


def context_now() -> otel_context.Context | None:
    """The trace context of this thread, to carry to another (within), or None without tracing."""
    return otel_context.get_current() if _tracer is not None else None


@contextlib.contextmanager
def within(context: otel_context.Context | None):
    """Run the block in context (context_now's, from another thread); None: as it is."""
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def run_trace_meta() -> dict[str, str]:
    """What a new run records of the trace it is made in ({"traceparent": ...}), or {} without tracing."""
    if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return {"traceparent": carrier["traceparent"]} if "traceparent" in carrier else {}


def run_trace_context(run) -> otel_context.Context:
    """The context a run's step spans hang under: the recorded one, else one whose trace id is the run's id."""
    recorded = (run.trigger_meta or {}).get("traceparent") if isinstance(run.trigger_meta, dict) else None
    if recorded:
        found = _propagator.extract({"traceparent": recorded})
        if trace.get_current_span(found).get_span_context().is_valid:
            return found
    ident = run.id.int
    root = SpanContext(
        trace_id=ident, span_id=(ident & 0xFFFFFFFFFFFFFFFF) or 1, is_remote=True, trace_flags=TraceFlags(1)
    )
    return trace.set_span_in_context(NonRecordingSpan(root))


# --- the walk's two hooks -------------------------------------------------------------------------


def step_span_begin(*, run, step_id: str, kind: str, attempt: int, key: str, item: int | None = None) -> None:
    """A step attempt begins (runs.walk.walk.Walk.begin): open its span."""
    if _tracer is None:
        return
    run_context = run_trace_context(run)
    run_trace = trace.get_current_span(run_context).get_span_context().trace_id
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == run_trace:
        parent, links = None, []  # the task that drives it is in the run's trace: the step hangs under the task
    else:
        parent, links = run_context, ([Link(current)] if current.is_valid else [])
    attributes: dict[str, Any] = {
        "pal.run_id": str(run.id),
        "pal.workflow": run.workflow.name,
        "pal.step_id": step_id,
        "pal.step_kind": kind,
        "pal.attempt": attempt,
        "pal.key": key,
    }
    if item is not None:
        attributes["pal.item"] = item
    span = _tracer.start_span(
        f"step {step_id}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes, links=links
    )
    with _open_lock:
        if len(_open) >= _MAX_OPEN:
            _open.clear()
        old = _open.pop(key, None)
        _open[key] = span
    if old is not None:
        old.end()  # the same attempt began again in this process (resumed after its walk stopped)


def step_span_end(
    *, kind: str, key: str, began: float, outcome: str, output: Any = None, error: BaseException | None = None
) -> None:
    """A step attempt came to an outcome (runs.walk.walk.Walk.settle hands it over: completed, failed, waiting,
    unknown or stopped): count it and close its span."""
    meters.step_ended(kind=kind, outcome=outcome, seconds=time.monotonic() - began, output=output)
    if _tracer is None:
        return  # no span was opened (step_span_begin)
    with _open_lock:
        span = _open.pop(key, None)
    if span is None:
        return
    span.set_attribute("pal.outcome", outcome)
    if isinstance(output, dict):
        usage = output.get("usage")
        for name in ("prompt_tokens", "completion_tokens"):
            tokens = usage.get(name) if isinstance(usage, dict) else None
            if isinstance(tokens, int):
                span.set_attribute(f"pal.tokens.{name.removesuffix('_tokens')}", tokens)
        if isinstance(output.get("cost_usd"), int | float):
            span.set_attribute("pal.cost_usd", float(output["cost_usd"]))
        if output.get("model"):
            span.set_attribute("pal.model", str(output["model"]))
    if outcome == "failed":
        span.set_status(Status(StatusCode.ERROR, str(getattr(error, "message", None) or error or "failed")[:500]))
        code = getattr(error, "code", None)
        if code:
            span.set_attribute("pal.error_code", str(code))
    span.end()

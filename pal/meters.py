"""The metrics that count events as they happen in a process (docs/reference/metrics.md): step durations by kind, model
tokens and cost, fenced-out walks, runs the sweep re-drove."""

# They are prometheus_client counters and a histogram. Under PROMETHEUS_MULTIPROC_DIR (read by prometheus_client
# when it is first imported) every process writes its values into a file of that directory and GET /metrics sums
# the files of all processes of the host: the Celery workers' prefork children, the uvicorn workers and a
# `manage.py pal_sweep`. Without it they live in the process alone (what a test or a one-process server sees).
# What can be read exactly from the database at scrape time is not here but in runs.metrics.

from typing import Any

from prometheus_client import Counter, Histogram

# From a cached echo (milliseconds) to a long agent or a durable child run (minutes).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

step_duration = Histogram(
    "pal_step_duration_seconds",
    "Time a step attempt ran in a worker, from its start (or its resumption) to its outcome, by step kind",
    ["kind"],
    buckets=STEP_BUCKETS,
)
llm_tokens = Counter("pal_llm_tokens", "Tokens that llm_call steps reported, by model and type", ["model", "type"])
llm_cost = Counter("pal_llm_cost_usd", "Cost in USD of llm_call steps (settings' prices), by model", ["model"])
fenced_out = Counter("pal_fenced_out", "Walks stopped because another worker took the run's lease (fenced out)")
sweep_redriven = Counter("pal_sweep_redriven", "Runs the recovery sweep re-drove (no live lease held them)")

ENDED = ("completed", "failed")
# step_duration's child of each kind: labels() looks it up under a lock at every call, and every step comes here
# (a child is the metric's own, kept for the process's life as prometheus_client keeps it).
_durations: dict[str, Any] = {}


def step_ended(*, kind: str, outcome: str, seconds: float, output: Any = None) -> None:
    """One attempt of a step reached an outcome in this process. Completed and failed attempts count toward the
    durations; a park (approval, signal, timer) or an unknown outcome does not, since the attempt goes on."""
    if outcome not in ENDED:
        return
    duration = _durations.get(kind)
    if duration is None:
        duration = _durations[kind] = step_duration.labels(kind=kind)
    duration.observe(max(0.0, seconds))
    if kind == "llm_call" and outcome == "completed" and isinstance(output, dict):
        model = str(output.get("model") or "unknown")
        usage = output.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        for kind_of_token in ("prompt", "completion"):
            tokens = usage.get(f"{kind_of_token}_tokens")
            if isinstance(tokens, int | float) and tokens > 0:
                llm_tokens.labels(model=model, type=kind_of_token).inc(tokens)
        cost = output.get("cost_usd")
        if isinstance(cost, int | float) and cost > 0:
            llm_cost.labels(model=model).inc(cost)

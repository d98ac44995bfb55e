"""GET /metrics (docs/reference/api.md, "Metrics"): Prometheus text from prometheus_client, right with any number
of worker and web processes on any number of hosts."""

# Two sources (docs/reference/metrics.md):
# - What the database knows exactly is read from it at scrape time by DatabaseCollector: runs by status, runs
# created and finished per workflow, stuck runs and the oldest one's age, side effects by channel and status,
# the last sweep's age. Every web process answers the same numbers, whichever of them Prometheus reaches.
# - What happens inside a process (step durations, model tokens and cost, fenced-out walks, sweep re-drives) is
# counted where it happens (pal.meters) and summed over the host's processes through prometheus_client's
# multiprocess mode (PROMETHEUS_MULTIPROC_DIR); this module connects the receivers for the last two.

import hmac
import os

from celery.signals import task_postrun
from django.conf import settings
from django.db.models import Count, Min
from django.db.models.signals import post_save
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from ninja.errors import AuthenticationError, AuthorizationError
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from pal import meters
from tokens.auth import viewer

from .models import SideEffect, SideEffectStatus, Sweep
from .selectors import status_counts, stuck_runs
from .tallies import run_counts

# --- what the database says, at scrape time -------------------------------------------------------


def stuck_summary(*, now) -> tuple[int, float]:
    """How many runs are stuck (runs.selectors.stuck_runs, the sweep's own definition) and how long the one that
    moved least recently has not moved, in seconds (0 when none is stuck)."""
    found = stuck_runs(now=now).order_by().aggregate(n=Count("id"), since=Min("updated_at"))
    since = found["since"]
    return found["n"], max(0.0, (now - since).total_seconds()) if since else 0.0


def side_effects_by_channel_and_status() -> list[tuple[str, str, int]]:
    rows = SideEffect.objects.order_by().values_list("channel", "status").annotate(n=Count("id"))
    return [(channel, status, n) for channel, status, n in rows]


class DatabaseCollector(Collector):
    """The metrics read from the database when Prometheus scrapes: exact, and the same from every process."""

    def collect(self):
        now = timezone.now()
        # Counters from runs.tallies (exact, at the cost of the last hour's runs); the gauge from the dashboard's
        # counts (runs.selectors.status_counts: exact for unfinished runs, an estimate past 1,000 of a final status).
        created, ended = run_counts(now=now)
        finished = CounterMetricFamily(
            "pal_runs_finished", "Runs that ended, by workflow and final status", labels=["workflow", "status"]
        )
        for (name, status), n in sorted(ended.items()):
            finished.add_metric([name, status], n)
        live = GaugeMetricFamily("pal_runs", "Runs in each status now", labels=["status"])
        for status, count in status_counts().items():
            live.add_metric([status], count["n"])
        made = CounterMetricFamily("pal_runs_created", "Runs created, by workflow", labels=["workflow"])
        for name, n in sorted(created.items()):
            made.add_metric([name], n)
        yield made
        yield finished
        yield live

        stuck, age = stuck_summary(now=now)
        yield GaugeMetricFamily(
            "pal_stuck_runs", "Runs that are not moving and should be (what the next sweep works on)", value=stuck
        )
        yield GaugeMetricFamily(
            "pal_oldest_stuck_run_age_seconds",
            "Seconds since the stuck run that moved least recently last moved (0: none is stuck)",
            value=age,
        )

        # A counter must only grow: every side effect counts once as claimed, and once more as delivered or
        # failed when it gets there (ends that never change); what is open now (claimed and not confirmed, or
        # unconfirmed after a crash until an operator resolves it) is a gauge.
        effects = CounterMetricFamily(
            "pal_side_effects",
            "Side effects (deliver steps' claims) by channel: claimed, then delivered or failed",
            labels=["channel", "status"],
        )
        opened = GaugeMetricFamily(
            "pal_side_effects_open",
            "Side effects not confirmed now, by channel: claimed (in flight) or unconfirmed (an operator decides)",
            labels=["channel", "status"],
        )
        claimed: dict[str, int] = {}
        for channel, status, n in side_effects_by_channel_and_status():
            claimed[channel] = claimed.get(channel, 0) + n
            if status in (SideEffectStatus.DELIVERED, SideEffectStatus.FAILED):
                effects.add_metric([channel, status], n)
            else:
                opened.add_metric([channel, status], n)
        for channel, n in sorted(claimed.items()):
            effects.add_metric([channel, SideEffectStatus.CLAIMED], n)
        yield effects
        yield opened

        last = Sweep.objects.filter(finished_at__isnull=False).order_by("-started_at").values("finished_at").first()
        if last is not None and last["finished_at"] is not None:
            yield GaugeMetricFamily(
                "pal_last_sweep_age_seconds",
                "Seconds since the last recovery sweep finished",
                value=max(0.0, (now - last["finished_at"]).total_seconds()),
            )


class _ThisProcess(Collector):
    """Without multiprocess mode: this process's own metrics (pal.meters, and the process and GC collectors)."""

    def collect(self):
        yield from REGISTRY.collect()


def metrics_registry() -> CollectorRegistry:
    """A registry for one scrape: the database's metrics, and the event metrics of every process of the host
    (multiprocess mode) or of this process alone."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    return registry


# --- the page -------------------------------------------------------------------------------------


def _refusal(status: int, detail: str, code: str) -> JsonResponse:
    response = JsonResponse({"detail": detail, "code": code}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def _allowed(request: HttpRequest) -> JsonResponse | None:
    """None when the request may read the metrics (PAL_METRICS_TOKEN, or an API token with the viewer role)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return _refusal(
            401,
            "this call needs 'Authorization: Bearer <token>' (an API token or PAL_METRICS_TOKEN)",
            "not_authenticated",
        )
    expected = settings.PAL_METRICS_TOKEN
    if expected and hmac.compare_digest(token.encode(), expected.encode()):
        return None
    try:
        viewer.check(token)
    except AuthenticationError as exc:
        return _refusal(401, str(exc), "not_authenticated")
    except AuthorizationError as exc:
        return _refusal(403, str(exc), "forbidden")
    return None


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition (format 0.0.4), for a viewer's token or PAL_METRICS_TOKEN."""
    refused = _allowed(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(metrics_registry()), content_type="text/plain; version=0.0.4; charset=utf-8")


# --- event counters fed by signals ----------------------------------------------------------------


def _sweep_finished(sender, instance: Sweep, created=False, **kwargs) -> None:
    """runs.recovery.sweep_once writes its record once, when the pass is over, with the runs it re-drove."""
    if created and instance.redriven:
        meters.sweep_redriven.inc(len(instance.redriven))


def _drive_ended(sender=None, retval=None, **kwargs) -> None:
    """runs.tasks.drive returns what runs.walk.run_drive says: "fenced" when another worker took the lease."""
    if getattr(sender, "name", None) == "runs.tasks.drive" and retval == "fenced":
        meters.fenced_out.inc()


def receivers_connect() -> None:
    """From RunsConfig.ready, in every process that sweeps or drives runs."""
    post_save.connect(_sweep_finished, sender=Sweep, dispatch_uid="runs.metrics.sweep_finished")
    task_postrun.connect(_drive_ended, dispatch_uid="runs.metrics.drive_ended", weak=False)

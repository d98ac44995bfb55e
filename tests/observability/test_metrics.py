"""GET /metrics (CONTRACT section 10): who may read it, what the database-backed metrics say, and, with real
worker and web processes sharing PROMETHEUS_MULTIPROC_DIR, that every number agrees with the journal."""

from __future__ import annotations

import math
from datetime import timedelta

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from journal.models import JournalEvent
from runs.models import Run, RunLock, SideEffect
from runs.recovery import sweep_once
from runs.tasks import drive
from tests.api.conftest import make_user, token_for
from tests.helpers import QUICK, booked_task_id, drive_to_end, echo, llm, make_run, start_run, wait_for_end
from tests.support import workers as worker_support
from tests.support.web import uvicorn_server

METRICS_TOKEN = "metrics-scraper-token-0123456789"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from Prometheus text, through prometheus_client's own parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(client: Client, token: str, path: str = "/api/v1/metrics"):
    return client.get(path, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.django_db
def test_metrics_answer_a_viewer_token_or_the_metrics_token_and_refuse_the_rest(settings):
    settings.PAL_METRICS_TOKEN = METRICS_TOKEN
    client = Client()
    nobody = client.get("/api/v1/metrics")
    assert nobody.status_code == 401 and nobody.json()["code"] == "not_authenticated"
    assert scrape(client, "pal_not-a-token").status_code == 401
    outsider = scrape(client, token_for(make_user("olga")))
    assert outsider.status_code == 403 and outsider.json()["code"] == "forbidden"
    viewer = scrape(client, token_for(make_user("vera", "runs.view_run")))
    assert viewer.status_code == 200 and viewer["Content-Type"].startswith("text/plain; version=0.0.4")
    scraper = scrape(client, METRICS_TOKEN, path="/metrics")
    assert scraper.status_code == 200
    text = scraper.content.decode()
    assert METRICS_TOKEN not in text
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {
        "pal_runs_created",
        "pal_runs_finished",
        "pal_runs",
        "pal_step_duration_seconds",
        "pal_llm_tokens",
        "pal_llm_cost_usd",
        "pal_side_effects",
        "pal_sweep_redriven",
        "pal_fenced_out",
        "pal_stuck_runs",
        "pal_oldest_stuck_run_age_seconds",
    } <= names


@pytest.mark.django_db
def test_a_posted_metrics_request_is_refused_without_a_server_error(settings):
    settings.PAL_METRICS_TOKEN = METRICS_TOKEN
    response = Client().post("/api/v1/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 405


@pytest.mark.django_db
def test_a_run_no_lease_holds_counts_as_stuck_with_its_age_and_the_sweep_counts_its_redrive(settings):
    settings.PAL_METRICS_TOKEN = METRICS_TOKEN
    run = make_run()
    RunLock.objects.filter(run_id=run.id).delete()  # the booked task was lost with its worker
    Run.objects.filter(id=run.id).update(updated_at=timezone.now() - timedelta(seconds=300))
    before = samples(scrape(Client(), METRICS_TOKEN).content.decode())
    assert before[("pal_stuck_runs", ())] == 1
    assert 290 <= before[("pal_oldest_stuck_run_age_seconds", ())] < 400
    assert before[("pal_runs", (("status", "queued"),))] == 1
    assert before[("pal_runs_created_total", (("workflow", run.workflow.name),))] == 1

    redriven = REGISTRY.get_sample_value("pal_sweep_redriven_total") or 0.0
    assert [str(run.id)] == sweep_once(who="test").redriven
    after = samples(scrape(Client(), METRICS_TOKEN).content.decode())
    assert after[("pal_sweep_redriven_total", ())] == redriven + 1
    assert after[("pal_stuck_runs", ())] == 0 and after[("pal_oldest_stuck_run_age_seconds", ())] == 0
    assert after[("pal_last_sweep_age_seconds", ())] < 60


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_metrics_scraped_from_two_web_processes_while_two_workers_run_agree_with_the_journal(
    celery_workers, llm_provider, webhook_receiver, tmp_path
):
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "PAL_METRICS_TOKEN": METRICS_TOKEN, **llm_provider.env()}
    env["PAL_WEBHOOK_SECRET"] = "test-webhook-secret"
    for name in ("metrics-a", "metrics-b"):
        celery_workers(env, name=name, concurrency=2, **QUICK)
    runs = [
        start_run(
            llm("draft", f"Summarise ticket {n}"),
            echo("lookup", n=n),
            {
                "id": "notify",
                "kind": "deliver",
                "channel": "webhook",
                "url": webhook_receiver.url,
                "body": {"n": n},
            },
        )
        for n in range(6)
    ]
    for run in runs:
        assert wait_for_end(run, timeout=90).status == "succeeded"

    database = worker_support.database_url()
    scraped = []
    for name in ("web-a", "web-b"):
        with uvicorn_server(database_url=database, env=env, log_dir=tmp_path / name) as web:
            response = httpx.get(f"{web}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30)
            assert response.status_code == 200, response.text
            scraped.append(samples(response.text))
    first, second = scraped
    assert first == second  # whichever web process Prometheus reaches, the same numbers

    ids = [run.id for run in runs]
    completed = list(JournalEvent.objects.filter(run_id__in=ids, kind="step_completed"))
    kind_of = {"draft": "llm_call", "lookup": "tool_call", "notify": "deliver"}
    by_kind: dict[str, int] = {}
    for event in completed:
        by_kind[kind_of[event.step_id]] = by_kind.get(kind_of[event.step_id], 0) + 1
    assert by_kind == {"llm_call": 6, "tool_call": 6, "deliver": 6}
    for kind, n in by_kind.items():
        assert first[("pal_step_duration_seconds_count", (("kind", kind),))] == n
        assert first[("pal_step_duration_seconds_bucket", (("kind", kind), ("le", "+Inf")))] == n
        assert first[("pal_step_duration_seconds_sum", (("kind", kind),))] > 0

    outputs = [e.payload["output"] for e in completed if e.step_id == "draft"]
    model = outputs[0]["model"]
    for type_ in ("prompt", "completion"):
        journaled = sum(o["usage"][f"{type_}_tokens"] for o in outputs)
        assert journaled > 0
        assert first[("pal_llm_tokens_total", (("model", model), ("type", type_)))] == journaled
    cost = sum(o["cost_usd"] for o in outputs)
    assert math.isclose(first[("pal_llm_cost_usd_total", (("model", model),))], cost, rel_tol=1e-9)

    workflows = {run.workflow.name for run in runs}
    for name in workflows:
        assert first[("pal_runs_created_total", (("workflow", name),))] == 1
        assert first[("pal_runs_finished_total", (("status", "succeeded"), ("workflow", name)))] == 1
    assert first[("pal_runs", (("status", "succeeded"),))] == Run.objects.filter(status="succeeded").count() == 6
    assert first[("pal_runs", (("status", "running"),))] == 0
    assert first[("pal_side_effects_total", (("channel", "webhook"), ("status", "delivered")))] == (
        SideEffect.objects.filter(channel="webhook", status="delivered").count()
    )
    assert first[("pal_side_effects_total", (("channel", "webhook"), ("status", "delivered")))] == 6
    assert first[("pal_side_effects_total", (("channel", "webhook"), ("status", "claimed")))] == 6
    assert ("pal_side_effects_open", (("channel", "webhook"), ("status", "claimed"))) not in first
    assert first[("pal_stuck_runs", ())] == 0
    assert first[("pal_fenced_out_total", ())] == 0
    assert len({r.headers.get("Idempotency-Key") for r in webhook_receiver.requests}) == 6


def this_process() -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
    }


@pytest.mark.django_db(transaction=True)
def test_a_walk_counts_each_attempt_by_kind_with_its_tokens_and_cost_as_the_journal_has_them():
    """In one process (no multiprocess directory): the walk's step hooks feed pal.meters directly."""
    run = make_run(
        steps=[
            {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Say hi"},
            {"id": "nope", "kind": "tool_call", "tool": "test_fail", "args": {}, "retry": {"max_attempts": 2}},
        ]
    )
    before = this_process()
    drive_to_end(run)
    assert run.status == "failed"
    after = this_process()

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("pal_step_duration_seconds_count", kind="llm_call") == 1
    # Two attempts of the failing tool, each a definite failure: two observations.
    assert grew("pal_step_duration_seconds_count", kind="tool_call") == 2
    output = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="draft").payload["output"]
    assert output["usage"]["prompt_tokens"] > 0 and output["usage"]["completion_tokens"] > 0
    for type_ in ("prompt", "completion"):
        assert grew("pal_llm_tokens_total", model=output["model"], type=type_) == output["usage"][f"{type_}_tokens"]
    assert math.isclose(grew("pal_llm_cost_usd_total", model=output["model"]), output["cost_usd"], abs_tol=1e-12)


@pytest.mark.django_db(transaction=True)
def test_a_drive_task_whose_lease_is_stolen_counts_one_fenced_out_walk():
    run = make_run(steps=[{"id": "grab", "kind": "tool_call", "tool": "test_steal_once", "args": {}}])
    before = REGISTRY.get_sample_value("pal_fenced_out_total") or 0.0
    result = drive.apply(args=[str(run.id)], task_id=booked_task_id(run))
    assert result.get() == "fenced"
    assert REGISTRY.get_sample_value("pal_fenced_out_total") == before + 1

"""POST /runs/{id}/fork and its preview (CONTRACT section 6): a fork of a finished llm/deliver run reuses the
steps before its fork point with no call to the model and no webhook sent, and runs the rest under its own keys.
Driven inline as a worker drives a run, against the local LLM provider and webhook receiver."""

import pytest

from journal.chain import chain_verify
from journal.models import JournalEvent
from runs.models import Run, RunStatus, SideEffect
from runs.receipts import run_receipt
from tests.api.conftest import assert_error
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import drive_to_end, make_workflow, wait_for_end

pytestmark = pytest.mark.django_db


@pytest.fixture
def peers(settings, llm_provider, webhook_receiver):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET
    return llm_provider, webhook_receiver


def triage_steps(hook_url: str) -> list[dict]:
    return [
        {"id": "draft", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Summarise: {{ input.ticket }}"},
        {
            "id": "notify",
            "kind": "deliver",
            "channel": "webhook",
            "url": hook_url,
            "body": {"summary": "{{ steps.draft.output.text }}"},
        },
        {"id": "close", "kind": "tool_call", "tool": "echo", "args": {"done": "{{ input.ticket }}"}},
    ]


@pytest.fixture
def finished(peers, operator):
    """A triage run that ran to its end: one model call, one webhook."""
    provider, receiver = peers
    workflow = make_workflow(steps=triage_steps(receiver.url))
    answer = operator.post("/runs", {"workflow": workflow.name, "input": {"ticket": "printer on fire"}})
    assert answer.status_code == 201, answer.content
    run = Run.objects.get(id=answer.json()["id"])
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(provider.calls) == 1 and len(receiver.deliveries) == 1
    return run


def journal(run_id) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(run_id=run_id).order_by("seq"))


def fork_of(operator, run, **body):
    answer = operator.post(f"/runs/{run.id}/fork", {"reason": "try again", **body})
    assert answer.status_code == 201, answer.content
    return Run.objects.get(id=answer.json()["id"]), answer.json()


def test_a_fork_from_the_last_step_calls_no_model_and_sends_no_webhook(finished, peers, operator):
    provider, receiver = peers

    fork, body = fork_of(operator, finished, from_step="close")
    drive_to_end(fork)

    assert fork.status == RunStatus.SUCCEEDED, fork.error
    assert len(provider.calls) == 1 and len(receiver.requests) == 1  # only the original's
    assert not SideEffect.objects.filter(run=fork).exists()
    assert body["forked_from"] == str(finished.id) and body["workflow"] == finished.workflow.name
    started = [e.step_id for e in journal(fork.id) if e.kind == "step_started"]
    assert started == ["close"]


def test_reused_steps_are_journaled_with_the_original_row_they_come_from(finished, operator):
    fork, _ = fork_of(operator, finished, from_step="close")
    drive_to_end(fork)

    original = {e.step_id: e for e in journal(finished.id) if e.kind == "step_completed"}
    reused = [e for e in journal(fork.id) if e.kind == "step_completed" and "reused_from" in e.payload]
    assert [e.step_id for e in reused] == ["draft", "notify"]
    for event in reused:
        assert event.payload["reused_from"] == {"run_id": str(finished.id), "seq": original[event.step_id].seq}
        assert event.payload["output"] == original[event.step_id].payload["output"]
    assert fork.output == finished.output


def test_both_runs_record_the_fork_with_who_and_why(finished, operator):
    fork, _ = fork_of(operator, finished, from_step="notify", reason="the hook was down")

    forked = [e for e in journal(finished.id) if e.kind == "run_forked"]
    assert len(forked) == 1
    assert forked[0].payload["fork_run_id"] == str(fork.id)
    assert forked[0].payload["who"] == "otto" and forked[0].payload["why"] == "the hook was down"
    created = journal(fork.id)[0]
    assert created.kind == "run_created"
    assert created.payload["forked_from"] == {
        "run_id": str(finished.id),
        "from_step": "notify",
        "by": "otto",
        "why": "the hook was down",
    }
    assert operator.get(f"/runs/{fork.id}").json()["forked_from"] == str(finished.id)
    assert operator.get(f"/runs/{finished.id}").json()["forked_from"] is None


def test_a_fork_from_the_webhook_sends_it_again_under_the_forks_key_and_reuses_the_model_call(
    finished, peers, operator
):
    provider, receiver = peers

    fork, _ = fork_of(operator, finished, from_step="notify")
    drive_to_end(fork)

    assert fork.status == RunStatus.SUCCEEDED, fork.error
    assert len(provider.calls) == 1
    assert [d.idempotency_key for d in receiver.deliveries] == [f"{finished.id}:notify:1", f"{fork.id}:notify:1"]
    assert receiver.deliveries[1].json == receiver.deliveries[0].json  # the reused draft's text


def test_a_fork_with_a_new_input_from_the_first_step_runs_everything_anew_with_it(finished, peers, operator):
    provider, receiver = peers

    fork, body = fork_of(operator, finished, from_step="draft", input={"ticket": "toner low"})
    drive_to_end(fork)

    assert body["input"] == {"ticket": "toner low"}
    assert len(provider.calls) == 2 and "toner low" in str(provider.calls[1].json["messages"])
    assert len(receiver.deliveries) == 2
    assert not [e for e in journal(fork.id) if "reused_from" in (e.payload or {})]


def test_the_preview_says_what_is_reused_from_which_row_and_what_runs(finished, operator):
    seqs = {e.step_id: e.seq for e in journal(finished.id) if e.kind == "step_completed"}

    answer = operator.post(f"/runs/{finished.id}/fork/preview", {"from_step": "notify", "input": {"ticket": "new"}})

    assert answer.status_code == 200, answer.content
    preview = answer.json()
    assert [(r["step_id"], r["seq"]) for r in preview["reused"]] == [("draft", seqs["draft"])]
    assert [(r["step_id"], r["why"]) for r in preview["rerun"]] == [("notify", "from_step"), ("close", "after notify")]
    assert preview["input_changed"] == ["ticket"]
    assert preview["reused"][0]["reads_changed_input"] == ["ticket"]  # reused all the same: the note says so
    assert "reusing is your choice" in preview["note"]
    assert preview["saved"]["prompt_tokens"] == preview["reused"][0]["prompt_tokens"] > 0
    assert not Run.objects.exclude(id=finished.id).exists()  # a preview creates nothing


def test_the_forks_receipt_names_what_it_reused_and_from_where(finished, operator):
    fork, _ = fork_of(operator, finished, from_step="close")
    drive_to_end(fork)

    receipt = run_receipt(run_id=fork.id)

    steps = {s["step_id"]: s for s in receipt["steps"]}
    original = {e.step_id: e.seq for e in journal(finished.id) if e.kind == "step_completed"}
    assert steps["draft"]["reused_from"] == {"run_id": str(finished.id), "seq": original["draft"]}
    assert steps["draft"]["executions"] == 0 and steps["draft"]["cost_usd"] == "0"
    assert steps["draft"]["kind"] == "llm_call" and steps["draft"]["side_effects"] == []
    assert steps["close"]["reused_from"] is None and steps["close"]["executions"] == 1
    assert receipt["totals"]["prompt_tokens"] == 0  # the model was paid for by the original


def test_the_forks_waterfall_shows_reused_steps_as_cached_bars(finished, operator):
    fork, _ = fork_of(operator, finished, from_step="close")
    drive_to_end(fork)

    bars = operator.get(f"/runs/{fork.id}/waterfall").json()["bars"]

    assert [(b["step_id"], b["status"], b["cached"]) for b in bars] == [
        ("draft", "completed", True),
        ("notify", "completed", True),
        ("close", "completed", False),
    ]


def test_a_skipped_step_stays_skipped_in_the_fork(peers, operator):
    workflow = make_workflow(
        steps=[
            {"id": "a", "kind": "tool_call", "tool": "echo", "args": {"n": 1}},
            {"id": "maybe", "kind": "tool_call", "tool": "echo", "args": {}, "when": "input.go", "needs": ["a"]},
            {"id": "b", "kind": "tool_call", "tool": "echo", "args": {"n": 2}, "needs": ["a"]},
        ]
    )
    answer = operator.post("/runs", {"workflow": workflow.name, "input": {"go": False}})
    original = Run.objects.get(id=answer.json()["id"])
    drive_to_end(original)

    fork, _ = fork_of(operator, original, from_step="b", input={"go": True})
    drive_to_end(fork)

    assert fork.status == RunStatus.SUCCEEDED
    skipped = [e for e in journal(fork.id) if e.kind == "step_skipped"]
    assert [e.step_id for e in skipped] == ["maybe"] and skipped[0].payload["reused_from"]["run_id"] == str(original.id)
    assert [e.step_id for e in journal(fork.id) if e.kind == "step_started"] == ["b"]


def test_a_step_the_original_never_finished_runs_in_the_fork(peers, operator):
    workflow = make_workflow(
        steps=[
            {"id": "a", "kind": "tool_call", "tool": "echo", "args": {"n": 1}},
            {"id": "bad", "kind": "tool_call", "tool": "test_fail", "args": {}},
            {"id": "c", "kind": "tool_call", "tool": "echo", "args": {"n": 3}, "needs": ["a"]},
        ]
    )
    answer = operator.post("/runs", {"workflow": workflow.name, "input": {}})
    original = Run.objects.get(id=answer.json()["id"])
    drive_to_end(original)
    assert original.status == RunStatus.FAILED

    preview = operator.post(f"/runs/{original.id}/fork/preview", {"from_step": "c"}).json()

    assert [r["step_id"] for r in preview["reused"]] == ["a"]
    assert ("bad", "no outcome in the original") in [(r["step_id"], r["why"]) for r in preview["rerun"]]


def test_a_fork_from_a_step_the_workflow_lacks_is_refused_naming_it(finished, operator):
    body = assert_error(
        operator.post(f"/runs/{finished.id}/fork", {"from_step": "nope", "reason": "x"}), 422, "unknown_step"
    )
    assert "nope" in body["detail"] and "draft" in body["detail"]
    assert not Run.objects.filter(forked_from=finished).exists()


def test_a_fork_needs_a_reason_an_object_input_and_an_operator(finished, operator, viewer):
    assert_error(operator.post(f"/runs/{finished.id}/fork", {"from_step": "close"}), 422)
    body = assert_error(
        operator.post(f"/runs/{finished.id}/fork", {"from_step": "close", "reason": "x", "input": [1]}), 422
    )
    assert "input" in body["detail"]
    assert_error(viewer.post(f"/runs/{finished.id}/fork", {"from_step": "close", "reason": "x"}), 403)
    assert_error(
        operator.post("/runs/00000000-0000-0000-0000-000000000000/fork", {"from_step": "close", "reason": "x"}), 404
    )
    assert not Run.objects.filter(forked_from=finished).exists()


def test_the_original_journal_still_verifies_after_the_fork(finished, operator):
    fork_of(operator, finished, from_step="close")

    finished.refresh_from_db()
    assert finished.journal_head_seq == journal(finished.id)[-1].seq  # the run_forked row is covered
    report = chain_verify(run_id=finished.id, expect_head=(finished.journal_head_seq, finished.journal_head_hash))
    assert report.ok, report.reason


@pytest.mark.integration
def test_a_fork_walked_by_a_real_worker_calls_no_peer_for_the_steps_it_reuses(
    llm_provider, webhook_receiver, celery_workers, operator
):
    celery_workers(env_overrides={**llm_provider.env(), **webhook_receiver.env()})
    workflow = make_workflow(steps=triage_steps(webhook_receiver.url))
    answer = operator.post("/runs", {"workflow": workflow.name, "input": {"ticket": "printer on fire"}})
    original = wait_for_end(Run.objects.get(id=answer.json()["id"]))
    assert original.status == RunStatus.SUCCEEDED, original.error
    assert len(llm_provider.calls) == 1 and len(webhook_receiver.requests) == 1

    fork, _ = fork_of(operator, original, from_step="close")
    fork = wait_for_end(fork)

    assert fork.status == RunStatus.SUCCEEDED, fork.error
    assert fork.output == original.output
    assert len(llm_provider.calls) == 1 and len(webhook_receiver.requests) == 1  # nothing more reached them
    assert [e.step_id for e in journal(fork.id) if e.kind == "step_started"] == ["close"]

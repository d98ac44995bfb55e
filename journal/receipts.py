"""A run's receipt: what it did, step by step, assembled from its journal alone.

For each step attempt: its key, kind, outcome, times, tokens and cost (from the usage an llm_call output
carries), and the side effects it claimed with what became of them; then the re-drives and retries with who
and why, the approval decisions and the signals taken, the totals, and a SHA-256 over the journal's rows so
a copy can be checked against the database.
Signing (Ed25519, GET /receipts/public-key) comes with the receipts issue; until then "signature" is null.
"""

import hashlib
from decimal import Decimal
from uuid import UUID

from django.conf import settings

from .models import RESERVED_KINDS
from .selectors import FINAL_KINDS, events_for_run
from .services import dumps

FORMAT = "pal-receipt/1"


def usage_of(output) -> tuple[int, int, float]:
    if not isinstance(output, dict):
        return 0, 0, 0.0
    usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cost = output.get("cost_usd")
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else 0,
        completion if isinstance(completion, int) and not isinstance(completion, bool) else 0,
        float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else 0.0,
    )


def journal_digest(events) -> str:
    """SHA-256 over the canonical JSON of every row, in seq order."""
    digest = hashlib.sha256()
    for e in events:
        row = [e.seq, e.kind, e.step_id, e.attempt, e.payload, e.created_at.isoformat(), e.writer, e.epoch]
        digest.update(dumps(row).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def receipt_build(*, run_id: UUID | str) -> dict:
    events = events_for_run(run_id=run_id)
    steps: dict[tuple[str, int], dict] = {}
    effects: dict[str, dict] = {}
    redrives, retries, approvals, signals, custom = [], [], [], [], []
    workflow, status, created_at, ended_at, error = None, "unfinished", None, None, None

    def step(step_id, attempt):
        key = (step_id, attempt)
        if key not in steps:
            steps[key] = {
                "step_id": step_id, "attempt": attempt, "key": f"{run_id}:{step_id}:{attempt}", "kind": None,
                "status": "started", "executions": 0, "started_at": None, "ended_at": None,
                "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "output_sha256": None, "error": None,
                "side_effects": [],
            }
        return steps[key]

    for e in events:
        payload = e.payload if isinstance(e.payload, dict) else {}
        if e.kind == "run_created":
            workflow = {"name": payload.get("workflow"), "version": payload.get("version")}
            created_at = e.created_at
        elif e.kind == "step_started":
            s = step(e.step_id, e.attempt)
            s["kind"] = payload.get("kind") or s["kind"]
            s["executions"] += 1
            s["started_at"] = s["started_at"] or e.created_at
        elif e.kind == "step_completed":
            s = step(e.step_id, e.attempt)
            output = payload.get("output")
            s["status"], s["ended_at"] = "completed", e.created_at
            s["prompt_tokens"], s["completion_tokens"], s["cost_usd"] = usage_of(output)
            s["output_sha256"] = hashlib.sha256(dumps(output).encode()).hexdigest()
        elif e.kind == "step_failed":
            s = step(e.step_id, e.attempt)
            s["status"], s["ended_at"] = "failed", e.created_at
            s["error"] = {k: v for k, v in payload.items() if k in ("message", "code", "permanent")}
        elif e.kind == "side_effect_claimed":
            effect = {"key": payload.get("key"), "channel": payload.get("channel"), "target": payload.get("target"),
                      "status": "claimed", "claimed_at": e.created_at, "settled_at": None}
            effects[effect["key"]] = effect
            step(e.step_id, e.attempt)["side_effects"].append(effect)
        elif e.kind.startswith("side_effect_") and payload.get("key") in effects:
            effect = effects[payload["key"]]
            effect["status"] = payload.get("status") or e.kind.removeprefix("side_effect_")
            effect["settled_at"] = e.created_at
        elif e.kind == "run_redriven":
            redrives.append({"seq": e.seq, "at": e.created_at, "by": payload.get("by") or payload.get("who"),
                             "why": payload.get("why"), "force": bool(payload.get("force")),
                             "previous_lease": payload.get("previous_lease")})
        elif e.kind == "run_retried":
            retries.append({"seq": e.seq, "at": e.created_at, "by": payload.get("by"), "why": payload.get("why"),
                            "step_id": e.step_id, "attempt": e.attempt})
        elif e.kind == "approval_decided":
            approvals.append({"seq": e.seq, "at": e.created_at, "step_id": e.step_id, "attempt": e.attempt,
                              "approved": bool(payload.get("approved")), "by": payload.get("by"),
                              "comment": payload.get("comment") or ""})
        elif e.kind == "signal_received":
            signals.append({"seq": e.seq, "at": e.created_at, "step_id": e.step_id, "name": payload.get("name"),
                            "sent_by": payload.get("sent_by") or None})
        elif e.kind in FINAL_KINDS:
            status, ended_at = e.kind.removeprefix("run_"), e.created_at
            error = payload.get("error") if e.kind == "run_failed" else None
        elif e.kind not in RESERVED_KINDS:
            custom.append({"seq": e.seq, "kind": e.kind, "step_id": e.step_id, "at": e.created_at})
        if e.kind == "run_retried":  # the failed run goes on: it has not ended after all
            status, ended_at, error = "unfinished", None, None

    step_list = sorted(steps.values(), key=lambda s: (s["started_at"] is None, s["started_at"] or 0, s["attempt"]))
    cost = sum((Decimal(str(s["cost_usd"])) for s in step_list), Decimal(0))
    return {
        "format": FORMAT,
        "run_id": str(run_id),
        "workflow": workflow,
        "status": status,
        "created_at": created_at,
        "ended_at": ended_at,
        "error": error,
        "steps": step_list,
        "redrives": redrives,
        "retries": retries,
        "approvals": approvals,
        "signals": signals,
        "custom_events": custom,
        "totals": {
            "attempts": len(step_list),
            "executions": sum(s["executions"] for s in step_list),
            "prompt_tokens": sum(s["prompt_tokens"] for s in step_list),
            "completion_tokens": sum(s["completion_tokens"] for s in step_list),
            "cost_usd": float(cost),
            "side_effects": len(effects),
            "redrives": len(redrives),
            "retries": len(retries),
        },
        "journal": {
            "events": len(events),
            "last_seq": events[-1].seq if events else 0,
            "sha256": journal_digest(events),
            # The hash chain's head (journal.chain), when the journal is chained: what a signature will cover.
            "head_hash": getattr(events[-1], "hash", None) if events else None,
        },
        "signature": None,
    }


# --- the signing key ------------------------------------------------------------------------------


class KeyNotConfigured(Exception):
    pass


def receipt_public_key_pem() -> str:
    """The PEM public key of PAL_RECEIPT_PRIVATE_KEY (or the file PAL_RECEIPT_PRIVATE_KEY_FILE names)."""
    from cryptography.hazmat.primitives import serialization

    private = settings.PAL_RECEIPT_PRIVATE_KEY
    if private is None:
        raise KeyNotConfigured("no receipt signing key is configured (PAL_RECEIPT_PRIVATE_KEY)")
    return private.public_key().public_bytes(
        encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()

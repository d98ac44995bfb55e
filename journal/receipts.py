"""A run's receipt from its journal alone, and how receipts are signed and checked (docs/RECEIPTS.md).

No payload beyond what is listed, no credential, no setting. Numbers are integers only; amounts of money and
durations are decimal strings ("0.00042"), so the canonical form is the same in any language. Signing: Ed25519
over canonical_bytes(receipt), the receipt without its "signature" as canonical JSON (CANONICAL below)."""

# receipt_build(run_id) folds one run's journal into its receipt: for each step attempt its key, kind, outcome,
# times, model, tokens and cost (from the usage an llm_call or agent output carries), the side effects it claimed
# with what became of them, and the re-drives that reused it instead of running it again; then the re-drives and
# retries with who and why, the cancellation, the approval decisions and the signals taken, the totals, and the
# head of the journal's hash chain (journal.chain). A graph's steps fold the same way: each item of a for_each
# step (journaled as "{step}[{index}]") is an attempt of its own, listed under its step's entry ("items"); a step
# that `when` skipped is an entry with status "skipped" and the value that decided; totals count both. runs.receipts
# adds what only run rows know (the parent, the head recorded when the run ended, the child runs as nested
# receipts, totals over the tree) and signs it.
#
# What a receipt never holds: payloads beyond what is listed (a step's output is only its SHA-256, an input not
# at all), credentials in a webhook URL, settings. The journal itself never holds a provider key, a webhook
# secret or a token either (tests/receipts/test_secrets.py).
#
# Signing: Ed25519 over canonical_bytes(receipt), which is the receipt without its "signature" field encoded as
# JSON with sorted keys, separators (",", ":"), non-ASCII characters as themselves (ensure_ascii=False), UTF-8
# (an unpaired surrogate, which UTF-8 cannot hold, as its \uXXXX escape): for a receipt's content, RFC 8785 (JCS).
# The "signed" block is inside what is signed and says all of this, with the key's id (SHA-256 hex of the raw
# 32-byte public key); "signature" is the base64 of the 64-byte signature.

import base64
import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.conf import settings

from .models import RESERVED_KINDS
from .selectors import FINAL_KINDS, events_for_run
from .services import GENESIS, dumps
from .text import utf8_safe_json

FORMAT = "pal-receipt/1"
ALG = "Ed25519"
CANONICAL = (
    "json: sort_keys, separators (',', ':'), ensure_ascii=False, allow_nan=False; utf-8; without the signature field"
)
CHAIN = (
    "per run: hash = sha256(prev_hash + '\\n' + canonical JSON of [run_id, seq, kind, step_id, attempt, payload, "
    "created_at, writer, epoch]); the first row's prev_hash is 64 zeros"
)
USAGE_KINDS = frozenset({"llm_call", "agent"})  # a child_run step's output is its child's: counted in the child
# An item of a for_each step: "read[3]". At most 10,000 items, so an index has at most 9 digits here: a longer one
# names no item (a 404 for the asker), never an int() of thousands of digits.
ITEM_ID = re.compile(r"^(?P<step>[a-z0-9_-]{1,64})\[(?P<index>[0-9]{1,9})\]$")


# --- values ---------------------------------------------------------------------------------------


def usage_of(output) -> tuple[int, int, float]:
    if not isinstance(output, dict):
        return 0, 0, 0.0
    usage = output["usage"] if isinstance(output.get("usage"), dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cost = output.get("cost_usd")
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else 0,
        completion if isinstance(completion, int) and not isinstance(completion, bool) else 0,
        float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else 0.0,
    )


def decimal_text(value) -> str:
    """An exact decimal string: 1.5e-05 -> "0.000015", Decimal("0.50") -> "0.5"."""
    number = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else str(value))
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "") else text


def when(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def seconds_between(start: datetime | None, end: datetime | None) -> str | None:
    if start is None or end is None:
        return None
    delta = end - start
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return decimal_text(Decimal(micros) / Decimal(1_000_000))


def json_safe(value):
    """The receipt as plain JSON: datetimes as UTC ISO strings, floats as decimal strings, no tuples."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, (float, Decimal)):
        return decimal_text(value)
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, UUID):
        return str(value)
    return str(value)


SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "sig", "auth", "code", "credential")


def redact_target(target):
    """A webhook URL without the credentials it may carry: no user:password@, and query values that look like
    secrets (?token=..., ?sig=...) replaced by ***. An email target (addresses) is kept as it is."""
    if not isinstance(target, str) or "://" not in target:
        return target
    try:
        parts = urlsplit(target)
    except ValueError:
        return "***"
    netloc = parts.netloc.rsplit("@", 1)[-1] if "@" in parts.netloc else parts.netloc
    query = parts.query
    if query:
        kept = []
        for pair in query.split("&"):
            name, sep, _value = pair.partition("=")
            kept.append(f"{name}=***" if sep and any(w in name.lower() for w in SECRET_WORDS) else pair)
        query = "&".join(kept)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


# --- the fold -------------------------------------------------------------------------------------


def plain_spend(step_id: str, kind: str | None, output, reused: bool) -> tuple[int, int, float]:
    """What a completed attempt spent, from the journal alone: the usage of an llm_call or agent output; nothing for
    a fork's step taken from its original (no call here), nor for a for_each step's own output (the list of its
    items' outputs: the items count)."""
    if reused or (kind is not None and kind not in USAGE_KINDS):
        return 0, 0, 0.0
    return usage_of(output)


def receipt_build(*, run_id: UUID | str, spend: Callable[[str, str | None, Any, bool], tuple] = plain_spend) -> dict:
    """One run's receipt from its journal alone (no child runs, unsigned). Deterministic: the same journal
    gives the same receipt, byte for byte. spend(step_id, kind, output, reused) -> (prompt tokens, completion
    tokens, dollars) counts each completed attempt (runs.spend gives the workflow's own rule)."""
    events = events_for_run(run_id=run_id)
    fold = ReceiptFold(run_id, spend)
    for e in events:
        fold.take(e)
    fold.retry_over()
    entries = [*fold.steps.values(), *fold.skipped.values()]
    for s in entries:
        s["duration_seconds"] = seconds_between(s["started_at"], s["ended_at"])
    first: dict[str | None, int] = {}  # a step's first row: orders steps of one commit (one moment)
    for e in events:
        first.setdefault(e.step_id, e.seq)
    step_list = sorted(nest_items(entries), key=lambda s: entry_order(s, first.get(s["step_id"], 0)))
    last = events[-1] if events else None
    return json_safe(
        {
            "format": FORMAT,
            "run_id": str(run_id),
            "workflow": fold.workflow,
            "status": fold.status,
            "created_at": fold.created_at,
            "ended_at": fold.ended_at,
            "error": fold.error,
            "cancellation": fold.cancellation,
            "steps": step_list,
            "redrives": fold.redrives,
            "retries": fold.retries,
            "approvals": fold.approvals,
            "signals": fold.signals,
            "custom_events": fold.custom,
            "totals": totals_of(step_list, redrives=len(fold.redrives), retries=len(fold.retries)),
            "journal": {
                "events": len(events),
                "last_seq": last.seq if last else 0,
                "head_seq": last.seq if last else 0,
                "head_hash": last.hash if last else GENESIS,
                "chain": CHAIN,
            },
            "signed": None,
            "signature": None,
        }
    )


class ReceiptFold:
    """receipt_build's state, folded one journal event at a time (take), in journal order."""

    def __init__(self, run_id: UUID | str, spend: Callable[[str, str | None, Any, bool], tuple]):
        self.run_id, self.spend = run_id, spend
        self.steps: dict[tuple[str, int], dict] = {}
        self.skipped: dict[str, dict] = {}  # step_id -> its entry: a step whose `when` was false
        self.effects: dict[str, dict] = {}
        self.completed: dict[str, dict] = {}  # step_id -> its current completed attempt: what a re-drive reuses
        self.redrives: list[dict] = []
        self.retries: list[dict] = []
        self.approvals: list[dict] = []
        self.signals: list[dict] = []
        self.custom: list[dict] = []
        self.workflow: dict | None = None
        self.status = "unfinished"
        self.created_at: datetime | None = None
        self.ended_at: datetime | None = None
        self.error: dict | None = None
        self.cancellation: dict | None = None
        self.retrying: tuple | None = None  # the first run_retried row of a retry whose rows are being folded

    def take(self, e) -> None:
        payload = e.payload if isinstance(e.payload, dict) else {}
        if e.kind != "run_retried":
            self.retry_over()
        handler = self.HANDLERS.get(e.kind)
        if handler is not None:
            handler(self, e, payload)
        elif e.kind.startswith("side_effect_") and payload.get("key") in self.effects:
            self.effect_settled(e, payload)
        elif e.kind in FINAL_KINDS:
            self.run_ended(e, payload)
        elif e.kind not in RESERVED_KINDS:
            self.custom.append({"seq": e.seq, "kind": e.kind, "step_id": e.step_id, "at": e.created_at})
        if e.kind == "run_retried":  # the failed run goes on: it has not ended after all
            self.status, self.ended_at, self.error = "unfinished", None, None

    def step(self, step_id, attempt) -> dict:
        key = (step_id, attempt)
        if key not in self.steps:
            self.steps[key] = {
                **step_entry(step_id),
                "attempt": attempt,
                "key": f"{self.run_id}:{step_id}:{attempt}",
                "status": "started",
            }
        return self.steps[key]

    def reuse(self, by_event, by, why) -> None:
        for s in self.completed.values():
            s["reused"].append(
                {
                    "seq": by_event.seq,
                    "at": by_event.created_at,
                    "by": by,
                    "why": why,
                    "kind": by_event.kind.removeprefix("run_"),
                }
            )

    def run_created(self, e, payload: dict) -> None:
        self.workflow = {"name": payload.get("workflow"), "version": payload.get("version")}
        self.created_at = e.created_at

    def step_started(self, e, payload: dict) -> None:
        s = self.step(e.step_id, e.attempt)
        s["kind"] = payload.get("kind") or s["kind"]
        s["executions"] += 1
        s["started_at"] = s["started_at"] or e.created_at
        if isinstance(payload.get("items"), int) and not isinstance(payload["items"], bool):
            s.setdefault("items", [])  # a for_each step: its items' attempts go here (nest_items)
        if self.completed.get(e.step_id, {}).get("attempt") != e.attempt:
            self.completed.pop(e.step_id, None)

    def step_completed(self, e, payload: dict) -> None:
        s = self.step(e.step_id, e.attempt)
        output = payload.get("output")
        s["status"], s["ended_at"] = "completed", e.created_at
        reused = isinstance(payload.get("reused_from"), dict)
        if reused:  # a fork's step taken from its original: no call here
            s["kind"], s["reused_from"] = s["kind"] or payload.get("kind"), payload["reused_from"]
        prompt, completion, cost = self.spend(e.step_id, s["kind"], output, reused)
        s["prompt_tokens"], s["completion_tokens"], s["total_tokens"] = prompt, completion, prompt + completion
        s["cost_usd"] = Decimal(repr(float(cost)))
        usage_kind = s["kind"] in USAGE_KINDS or s["kind"] is None
        if not reused and usage_kind and isinstance(output, dict) and isinstance(output.get("model"), str):
            s["model"] = output["model"]
        s["output_sha256"] = hashlib.sha256(dumps(output).encode()).hexdigest()
        self.completed[e.step_id] = s

    def step_skipped(self, e, payload: dict) -> None:
        self.skipped[e.step_id] = s = skipped_entry(e, payload)
        self.completed[e.step_id] = s  # a re-drive keeps the decision: the step is not evaluated again

    def step_failed(self, e, payload: dict) -> None:
        s = self.step(e.step_id, e.attempt)
        s["status"], s["ended_at"] = "failed", e.created_at
        s["error"] = {k: payload.get(k) for k in ("message", "code", "permanent") if k in payload}

    def child_linked(self, e, payload: dict) -> None:
        child = payload.get("child_run_id")
        if child:
            self.step(e.step_id, e.attempt)["child_run_id"] = child

    def effect_claimed(self, e, payload: dict) -> None:
        effect = {
            "key": payload.get("key"),
            "channel": payload.get("channel"),
            "target": redact_target(payload.get("target")),
            "status": "claimed",
            "claimed_at": e.created_at,
            "settled_at": None,
            "seq": e.seq,
        }
        self.effects[effect["key"]] = effect
        self.step(e.step_id, e.attempt)["side_effects"].append(effect)

    def effect_settled(self, e, payload: dict) -> None:
        effect = self.effects[payload["key"]]
        effect["status"] = payload.get("status") or e.kind.removeprefix("side_effect_")
        effect["settled_at"], effect["seq"] = e.created_at, e.seq

    def run_redriven(self, e, payload: dict) -> None:
        by, why = payload.get("by") or payload.get("who"), payload.get("why")
        self.reuse(e, by, why)
        self.redrives.append(
            {
                "seq": e.seq,
                "at": e.created_at,
                "by": by,
                "why": why,
                "force": bool(payload.get("force")),
                "previous_lease": payload.get("previous_lease"),
            }
        )

    def run_retried(self, e, payload: dict) -> None:
        by, why = payload.get("by") or payload.get("who"), payload.get("why")
        self.completed.pop(e.step_id, None)  # the retried step runs again with attempt + 1
        # One retry journals a row per step that goes on (every failed one; from a step, the steps after it too):
        # what it reused is what none of its rows runs again, known once its last row is folded (retry_over).
        self.retrying = self.retrying or (e, by, why)
        self.retries.append(
            {"seq": e.seq, "at": e.created_at, "by": by, "why": why, "step_id": e.step_id, "attempt": e.attempt}
        )

    def retry_over(self) -> None:
        """The retry's rows are folded: the steps it kept completed were reused, by its first row."""
        if self.retrying is not None:
            self.reuse(*self.retrying)
            self.retrying = None

    def approval_decided(self, e, payload: dict) -> None:
        self.approvals.append(
            {
                "seq": e.seq,
                "at": e.created_at,
                "step_id": e.step_id,
                "attempt": e.attempt,
                "approved": bool(payload.get("approved")),
                "by": payload.get("by"),
                "comment": payload.get("comment") or "",
            }
        )

    def signal_received(self, e, payload: dict) -> None:
        self.signals.append(
            {
                "seq": e.seq,
                "at": e.created_at,
                "step_id": e.step_id,
                "name": payload.get("name"),
                "sent_by": payload.get("sent_by") or None,
            }
        )

    def run_ended(self, e, payload: dict) -> None:
        self.status, self.ended_at = e.kind.removeprefix("run_"), e.created_at
        raw = payload.get("error") if e.kind == "run_failed" else None
        self.error = (
            {k: raw.get(k) for k in ("step_id", "attempt", "code", "message") if k in raw}
            if isinstance(raw, dict)
            else None
        )
        if e.kind == "run_cancelled":
            self.cancellation = {
                "seq": e.seq,
                "at": e.created_at,
                "by": payload.get("by") or payload.get("who"),
                "why": payload.get("reason") or payload.get("why"),
            }

    HANDLERS: ClassVar[dict[str, Callable[["ReceiptFold", Any, dict], object]]] = {
        "run_created": run_created,
        "step_started": step_started,
        "step_completed": step_completed,
        "step_skipped": step_skipped,
        "step_failed": step_failed,
        "child_created": child_linked,
        "child_adopted": child_linked,
        "side_effect_claimed": effect_claimed,
        "run_redriven": run_redriven,
        "run_retried": run_retried,
        "definition_moved": lambda fold, e, _: fold.completed.pop(e.step_id, None),  # it runs again: not reused
        "approval_decided": approval_decided,
        "signal_received": signal_received,
    }


def step_entry(step_id: str) -> dict:
    """A step's entry before anything is known of it: no attempt, no spend, nothing reused."""
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost_usd": Decimal(0)}
    nothing = dict.fromkeys(("attempt", "key", "kind", "started_at", "ended_at", "duration_seconds", "model"))
    return {"step_id": step_id, **nothing, "executions": 0, **zero, "output_sha256": None, "error": None,
            "side_effects": [], "child_run_id": None, "reused": [], "reused_from": None}  # fmt: skip


def skipped_entry(event, payload: dict) -> dict:
    """A step whose `when` was false: an entry shaped like an attempt's, with no attempt, key or execution, and
    the expression with the value that decided ("when")."""
    return {
        **step_entry(event.step_id),
        "kind": payload.get("kind"),
        "status": "skipped",
        "ended_at": event.created_at,
        "when": {"expression": payload.get("when"), "value": payload.get("value")},
        "reused_from": payload["reused_from"] if isinstance(payload.get("reused_from"), dict) else None,
    }


def nest_items(entries: list[dict]) -> list[dict]:
    """The entries without the items of for_each steps: each item's attempts are moved under the latest attempt of
    its step ("items", by index then attempt), with their index. An item whose step never started (a journal
    edited by hand) stays where it is."""
    fan_outs: dict[str, dict] = {}
    for s in entries:
        if "items" in s and (s["step_id"] not in fan_outs or s["attempt"] > fan_outs[s["step_id"]]["attempt"]):
            fan_outs[s["step_id"]] = s
    if not fan_outs:
        return entries
    top = []
    for s in entries:
        match = ITEM_ID.match(s["step_id"] or "") if s["status"] != "skipped" else None
        if match and match["step"] in fan_outs:
            fan_outs[match["step"]]["items"].append({**s, "index": int(match["index"])})
        else:
            top.append(s)
    for owner in fan_outs.values():
        owner["items"].sort(key=lambda s: (s["index"], s["attempt"]))
    return top


def entry_order(s: dict, first_seq: int = 0):
    """Steps in the order they started (a skipped step where it was skipped; at one moment, by their first row),
    attempts in order; unstarted last."""
    moment = s["started_at"] or (s["ended_at"] if s["status"] == "skipped" else None)
    return (moment is None, moment or 0, first_seq, s["attempt"] or 0)


def attempts_of(step_list: list[dict]):
    """Every attempt entry of a receipt's steps, each for_each step's items right after it (skipped steps too)."""
    for s in step_list:
        yield s
        yield from s.get("items") or ()


def totals_of(step_list: list[dict], *, redrives: int, retries: int) -> dict:
    every = list(attempts_of(step_list))
    cost = sum((Decimal(str(s["cost_usd"])) for s in every), Decimal(0))
    prompt = sum(s["prompt_tokens"] for s in every)
    completion = sum(s["completion_tokens"] for s in every)
    return {
        "attempts": sum(1 for s in every if s["status"] != "skipped"),
        "executions": sum(s["executions"] for s in every),
        "reused": sum(len(s["reused"]) for s in every),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cost_usd": decimal_text(cost),
        "side_effects": sum(len(s["side_effects"]) for s in every),
        "redrives": redrives,
        "retries": retries,
    }


# --- signing --------------------------------------------------------------------------------------


class KeyNotConfigured(Exception):
    pass


class BadKey(ValueError):
    pass


def canonical_bytes(receipt: dict) -> bytes:
    """What the signature covers: the receipt without its signature field, canonical JSON, UTF-8."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    # An unpaired surrogate (a peer's error message) cannot be UTF-8: it is written as its \uXXXX escape.
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return utf8_safe_json(text).encode("utf-8")


def key_id(public_key) -> str:
    """SHA-256 (hex) of the raw 32-byte Ed25519 public key."""
    raw = public_key.public_bytes(encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_key_pem(public_key) -> str:
    return public_key.public_bytes(
        encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def receipt_public_key_pem() -> str:
    """The PEM public key of PAL_RECEIPT_PRIVATE_KEY (or the file PAL_RECEIPT_PRIVATE_KEY_FILE names)."""
    private = settings.PAL_RECEIPT_PRIVATE_KEY
    if private is None:
        raise KeyNotConfigured("no receipt signing key is configured (PAL_RECEIPT_PRIVATE_KEY)")
    return public_key_pem(private.public_key())


def public_key_load(pem: bytes, *, name: str = "the public key"):
    """An Ed25519 public key from PEM (what GET /api/v1/receipts/public-key serves). Raises BadKey."""

    if b"PRIVATE KEY" in pem:
        raise BadKey(f"{name} is a private key; give the public key (GET /api/v1/receipts/public-key)")
    try:
        key = load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise BadKey(f"{name} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadKey(f"{name} is not an Ed25519 key (it is {type(key).__name__})")
    return key


def receipt_sign(receipt: dict, private_key) -> dict:
    """Sign in place (and return) a receipt: the signed block, then the signature over the canonical form."""
    public = private_key.public_key()
    receipt.pop("signature", None)
    receipt["signed"] = {
        "alg": ALG,
        "key_id": key_id(public),
        "canonical": CANONICAL,
        "signature_encoding": "base64",
        "public_key": "GET /api/v1/receipts/public-key",
    }
    receipt["signature"] = base64.b64encode(private_key.sign(canonical_bytes(receipt))).decode("ascii")
    return receipt


def signature_problem(receipt, public_key) -> str | None:
    """Why the receipt's signature does not hold for this public key, or None when it does."""

    if not isinstance(receipt, dict):
        return "the file is not a receipt (not a JSON object)"
    signature, signed = receipt.get("signature"), receipt.get("signed")
    if not signature or not isinstance(signed, dict):
        return "the receipt is not signed (signature is null: no key was configured when it was made)"
    if signed.get("alg") != ALG:
        return f"the receipt is signed with {signed.get('alg')!r}, not {ALG}"
    expected = key_id(public_key)
    if signed.get("key_id") != expected:
        return f"the receipt was signed by key {signed.get('key_id')}, not by the key given ({expected})"
    try:
        raw = base64.b64decode(signature, validate=True)
    except (ValueError, TypeError):
        return "the signature is not base64"
    if base64.b64encode(raw).decode("ascii") != signature:  # unused low bits changed: one signature, one text
        return "the signature is not in canonical base64: it was changed after it was signed"
    try:
        body = canonical_bytes(receipt)
    except (TypeError, ValueError) as exc:
        return f"the receipt cannot be put in canonical form: {exc}"
    try:
        public_key.verify(raw, body)
    except InvalidSignature:
        return "the signature does not match the receipt's content: it was changed after it was signed"
    return None

"""The receipt's bodies (GET /api/v1/runs/{id}/receipt, docs/RECEIPTS.md): a run's tree, its steps and totals.

Numbers in a receipt are integers; money and durations are exact decimal strings ("0.00042"), so the signed
canonical form is the same in every language (journal.receipts).
"""

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema


def _usd():
    return Field(..., description="US dollars, an exact decimal string", examples=["0.00042"])


class ReceiptSideEffectOut(Schema):
    key: str | None = None
    channel: str | None = None
    target: str | None = Field(None, description="the URL (credentials removed) or the addresses")
    status: str = Field(..., description="claimed, delivered, failed, unconfirmed, or what an operator resolved")
    claimed_at: datetime
    settled_at: datetime | None = None
    seq: int = Field(..., description="the journal row that last changed it")


class ReceiptReuseOut(Schema):
    seq: int = Field(..., description="the run_redriven or run_retried row")
    at: datetime
    by: str | None = None
    why: str | None = None
    kind: Literal["redriven", "retried"]


class ReceiptReusedFromOut(Schema):
    run_id: str
    seq: int


class ReceiptStepOut(Schema):
    step_id: str | None = None
    attempt: int | None = None
    key: str | None = Field(..., description="the idempotency key {run_id}:{step_id}:{attempt} (null: skipped)")
    kind: str | None = None
    status: Literal["started", "completed", "failed", "skipped"] = Field(..., description="the attempt's outcome")
    executions: int = Field(..., description="how many times the attempt was started (more than 1 after a crash)")
    started_at: datetime | None = None
    ended_at: datetime | None = None
    duration_seconds: str | None = Field(None, description="from its first start to its outcome, a decimal string")
    model: str | None = None
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: str = _usd()
    output_sha256: str | None = None
    error: dict[str, Any] | None = None
    side_effects: list[ReceiptSideEffectOut]
    child_run_id: str | None = None
    reused: list[ReceiptReuseOut] = Field(
        ..., description="re-drives that reused this attempt's journaled output instead of running it again"
    )
    reused_from: ReceiptReusedFromOut | None = Field(
        None, description="a fork's step taken from its original (no call, nothing sent): the run and the row"
    )


class ReceiptItemOut(ReceiptStepOut):
    index: int = Field(..., description="the item's place in its for_each step's list (step_id '{step}[{index}]')")


class ReceiptForEachStepOut(ReceiptStepOut):
    """A for_each step's attempt: its own output is the list of its items' outputs, so its tokens and cost are
    its own only (none for an llm_call); each item's are on the item and in totals once."""

    items: list[ReceiptItemOut] = Field(..., description="its items' attempts, by index then attempt")


class ReceiptWhenOut(Schema):
    expression: str | None = None
    value: Any = Field(None, description="what the expression gave")


class ReceiptSkippedStepOut(ReceiptStepOut):
    """A step whose `when` was false: no attempt, no key, nothing run."""

    attempt: None = None
    key: None = None
    status: Literal["skipped"]
    when: ReceiptWhenOut


class ReceiptRedriveOut(Schema):
    seq: int
    at: datetime
    by: str | None = None
    why: str | None = None
    force: bool
    previous_lease: dict[str, Any] | None = None


class ReceiptRetryOut(Schema):
    seq: int
    at: datetime
    by: str | None = None
    why: str | None = None
    step_id: str | None = None
    attempt: int | None = None


class ReceiptCancellationOut(Schema):
    seq: int
    at: datetime
    by: str | None = None
    why: str | None = None


class ReceiptApprovalOut(Schema):
    seq: int
    at: datetime
    step_id: str | None = None
    attempt: int | None = None
    approved: bool
    by: str | None = None
    comment: str


class ReceiptSignalOut(Schema):
    seq: int
    at: datetime
    step_id: str | None = None
    name: str | None = None
    sent_by: str | None = None


class ReceiptCustomEventOut(Schema):
    seq: int
    kind: str
    step_id: str | None = None
    at: datetime


class ReceiptTotalsOut(Schema):
    attempts: int
    executions: int
    reused: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: str = _usd()
    side_effects: int
    redrives: int
    retries: int


class ReceiptTreeTotalsOut(Schema):
    runs: int = Field(..., description="this run and every descendant")
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: str = _usd()
    side_effects: int


class ReceiptHeadOut(Schema):
    seq: int
    hash: str


class ReceiptJournalOut(Schema):
    events: int
    last_seq: int
    head_seq: int = Field(..., description="the chain's last row")
    head_hash: str = Field(..., description="its hash: it covers every row before it (journal.chain)")
    chain: str = Field(..., description="how each row's hash is computed")
    recorded_head: ReceiptHeadOut | None = Field(None, description="the head the run row recorded when it ended")


class ReceiptWorkflowOut(Schema):
    name: str | None = None
    version: int | None = None


class ReceiptParentOut(Schema):
    run_id: str
    step_id: str | None = None
    attempt: int | None = None


class ReceiptSignedOut(Schema):
    alg: Literal["Ed25519"]
    key_id: str = Field(..., description="SHA-256 (hex) of the raw 32-byte public key")
    canonical: str = Field(..., description="the exact encoding the signature covers")
    signature_encoding: Literal["base64"]
    public_key: str


class ReceiptChildOut(Schema):
    """A child run's receipt, nested in its parent's (covered by the root's signature)."""

    format: str
    run_id: UUID
    workflow: ReceiptWorkflowOut | None = None
    status: Literal["unfinished", "succeeded", "failed", "cancelled"]
    created_at: datetime | None = None
    ended_at: datetime | None = None
    error: dict[str, Any] | None = None
    cancellation: ReceiptCancellationOut | None = None
    parent: ReceiptParentOut | None = None
    depth: int
    created_by: str
    steps: list[ReceiptForEachStepOut | ReceiptSkippedStepOut | ReceiptStepOut]
    redrives: list[ReceiptRedriveOut]
    retries: list[ReceiptRetryOut]
    approvals: list[ReceiptApprovalOut]
    signals: list[ReceiptSignalOut]
    custom_events: list[ReceiptCustomEventOut]
    totals: ReceiptTotalsOut
    tree_totals: ReceiptTreeTotalsOut
    journal: ReceiptJournalOut
    children: list["ReceiptChildOut"]


class ReceiptOut(ReceiptChildOut):
    signed: ReceiptSignedOut | None = Field(None, description="null when no signing key is configured")
    signature: str | None = Field(
        None, description="base64 Ed25519 signature over the canonical form of everything else (null when unsigned)"
    )


ReceiptChildOut.model_rebuild()

"""Request and answer bodies of the REST API (docs/reference/api.md)."""

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema
from pydantic import ConfigDict

RunStatusName = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
NAME_PATTERN = r"^[a-z0-9_-]{1,64}$"
KIND_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class Strict(Schema):
    """A request body: unknown fields are refused (422 naming them), not silently dropped."""

    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------------------


class FieldError(Schema):
    loc: str = Field(..., description='where, e.g. "steps[2].model" or "query.limit"')
    msg: str


class ErrorOut(Schema):
    detail: str = Field(..., description="what went wrong, in words")
    code: str = Field(..., description="stable machine-readable code, e.g. run_not_found, lease_held")
    errors: list[FieldError] | None = Field(None, description="one entry per bad field (422 only)")


# --- workflows ------------------------------------------------------------------------------------


class WorkflowIn(Strict):
    """A workflow definition (docs/reference/workflows.md). Steps are checked kind by kind; every problem is named."""

    name: str = Field(..., description="1-64 of a-z 0-9 - _; an existing name makes a new version")
    description: str = ""
    steps: list[dict[str, Any]] = Field(
        ..., description="{id, kind, ...kind fields, retry?, timeout_seconds?, needs?, when?, for_each?, ...}"
    )
    # Checked by runs.workflows.validate_definition, which names what is wrong in them.
    output: Any = Field(None, description="the run's output: JSON with templates; default: the last step's output")
    concurrency: Any = Field(None, description='{"key"?: template, "max_runs": N}: runs at once per key')
    budget: Any = Field(None, description='{"max_cost_usd"?, "max_tokens"?}: caps over the run and its children')


class WorkflowOut(Schema):
    name: str
    version: int
    description: str
    definition: dict[str, Any]
    created_at: datetime


class WorkflowVersionOut(Schema):
    version: int
    description: str
    created_at: datetime


class WorkflowSummaryOut(Schema):
    name: str
    version: int = Field(..., description="the latest version")
    description: str
    steps: int = Field(..., description="how many steps the latest version has")
    created_at: datetime


class WorkflowListOut(Schema):
    items: list[WorkflowSummaryOut]


class WorkflowDetailOut(WorkflowOut):
    versions: list[WorkflowVersionOut] = Field(..., description="every version, newest first")


# --- runs -----------------------------------------------------------------------------------------


class RunIn(Strict):
    workflow: str = Field(..., description="workflow name")
    input: dict[str, Any] = Field(default_factory=dict)
    version: int | None = Field(None, ge=1, description="a version of the workflow; the latest if left out")


class LeaseOut(Schema):
    owner: str = Field(..., description='a worker ("host:pid:nonce") or a booking for one task ("task:<id>")')
    epoch: int
    expires_at: datetime


class RunOut(Schema):
    id: UUID
    workflow: str
    version: int
    status: RunStatusName
    input: dict[str, Any]
    output: Any = None
    error: dict[str, Any] | None = None
    parent_run_id: UUID | None = None
    parent_step_id: str | None = None
    depth: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease: LeaseOut | None = None
    waiting_on: Any = None
    why: str | None = Field(None, description="for a run that has not ended: why it is not moving, in words")


class RunSummaryOut(Schema):
    """A run in a list: without input, output and why (GET /runs/{id} has them)."""

    id: UUID
    workflow: str
    version: int
    status: RunStatusName
    error: dict[str, Any] | None = None
    parent_run_id: UUID | None = None
    parent_step_id: str | None = None
    depth: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease: LeaseOut | None = None
    waiting_on: Any = None


class RunListOut(Schema):
    items: list[RunSummaryOut]
    next_cursor: str | None = Field(None, description="pass as cursor for the next (older) page; null at the end")


class ReasonIn(Strict):
    reason: str = Field(..., min_length=1, max_length=2000)


class RedriveIn(ReasonIn):
    force: bool = Field(False, description="steal a live lease (a new epoch fences the old holder out)")


class ApprovalIn(Strict):
    approved: bool
    comment: str = Field("", max_length=2000)
    attempt: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="the step attempt this decision is for (waiting_on.attempt); "
        "a decision for another attempt answers 409. Absent: the attempt waiting now",
    )


class SignalIn(Strict):
    payload: Any = None


class SignalOut(Schema):
    id: int
    run_id: UUID
    name: str
    payload: Any = None
    created_at: datetime
    consumed_at: datetime | None = None


# --- journal --------------------------------------------------------------------------------------


class EventOut(Schema):
    seq: int
    kind: str
    step_id: str | None = None
    attempt: int | None = None
    payload: Any = None
    created_at: datetime


class EventPageOut(Schema):
    items: list[EventOut]
    next_after_seq: int = Field(
        ..., description="the last seq of this page (after_seq when it is empty): pass it as after_seq to read on"
    )


class EventIn(Strict):
    kind: str = Field(..., pattern=KIND_PATTERN, description="any kind but the engine's reserved ones")
    step_id: str | None = Field(None, pattern=NAME_PATTERN)
    payload: Any = Field(default_factory=dict)


class BarOut(Schema):
    step_id: str
    kind: str | None = None
    attempt: int | None = None
    started_at: datetime
    ended_at: datetime | None = None
    status: Literal["running", "waiting", "completed", "failed", "interrupted", "cancelled"]
    cached: bool = Field(..., description="reused from the journal by a re-drive or retry, not run again")
    child_run_id: UUID | None = None


class RunBriefOut(Schema):
    id: UUID
    workflow: str
    version: int
    status: RunStatusName
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class WaterfallOut(Schema):
    run: RunBriefOut
    bars: list[BarOut]


class ReusedStepOut(Schema):
    step_id: str
    kind: str | None = None
    attempt: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class RerunStepOut(Schema):
    step_id: str
    kind: str | None = None
    attempt: int
    resumes: bool = Field(..., description="the attempt had started before: it runs again under the same key")


class OpenSideEffectOut(Schema):
    key: str
    step_id: str
    attempt: int
    channel: str
    target: str
    status: Literal["claimed", "unconfirmed"]
    on_redrive: str


class SavedOut(Schema):
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class RedrivePreviewOut(Schema):
    run_id: UUID
    status: RunStatusName
    can_redrive: bool = Field(..., description="false once the run has ended (use retry for a failed run)")
    needs_force: bool = Field(..., description="a live lease holds the run: only a forced re-drive takes it")
    lease: LeaseOut | None = None
    reused: list[ReusedStepOut]
    rerun: list[RerunStepOut]
    side_effects: list[OpenSideEffectOut]
    saved: SavedOut


# --- receipts -------------------------------------------------------------------------------------
# Numbers in a receipt are integers; money and durations are exact decimal strings ("0.00042"), so the signed
# canonical form is the same in every language (journal.receipts).


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


class ReceiptStepOut(Schema):
    step_id: str | None = None
    attempt: int | None = None
    key: str = Field(..., description="the idempotency key {run_id}:{step_id}:{attempt}")
    kind: str | None = None
    status: Literal["started", "completed", "failed"] = Field(..., description="the attempt's outcome")
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
    steps: list[ReceiptStepOut]
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


# --- system ---------------------------------------------------------------------------------------


class HealthOut(Schema):
    database: Literal["ok", "error"]
    broker: Literal["ok", "error"]
    sweep: Literal["ok", "stale", "none", "unknown"] = Field(
        ...,
        description="the workers' side: ok when the last recovery sweep is recent (a few PAL_RECOVERY_INTERVALs); "
        "stale when it is older; none before the first sweep; unknown when the database is away",
    )
    last_sweep_at: datetime | None = Field(None, description="when the last recovery sweep finished")


class UnhealthyOut(HealthOut):
    detail: str = Field(..., description="what failed")
    code: Literal["unhealthy"]
    problems: list[str] = Field(
        ..., description="one sentence per failed check, each starting with its name (database, broker, sweep)"
    )

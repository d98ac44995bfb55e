"""Request and answer bodies of the REST API (CONTRACT section 6)."""

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
    """A workflow definition (CONTRACT section 3). Steps are checked kind by kind; every problem is named."""

    name: str = Field(..., description="1-64 of a-z 0-9 - _; an existing name makes a new version")
    description: str = ""
    steps: list[dict[str, Any]] = Field(..., description="{id, kind, ...kind fields, retry?, timeout_seconds?}")


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
    next_after_seq: int = Field(..., description="the last seq of this page (after_seq when it is empty): pass it "
                                "as after_seq to read on")


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


class ReceiptSideEffectOut(Schema):
    key: str | None = None
    channel: str | None = None
    target: str | None = None
    status: str
    claimed_at: datetime
    settled_at: datetime | None = None


class ReceiptStepOut(Schema):
    step_id: str | None = None
    attempt: int | None = None
    key: str
    kind: str | None = None
    status: Literal["started", "completed", "failed"]
    executions: int = Field(..., description="how many times the attempt was started (more than 1 after a crash)")
    started_at: datetime | None = None
    ended_at: datetime | None = None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    output_sha256: str | None = None
    error: dict[str, Any] | None = None
    side_effects: list[ReceiptSideEffectOut]


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
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    side_effects: int
    redrives: int
    retries: int


class ReceiptJournalOut(Schema):
    events: int
    last_seq: int
    sha256: str = Field(..., description="SHA-256 over the canonical JSON of every journal row, in seq order")
    head_hash: str | None = Field(None, description="the hash of the last row in the journal's hash chain")


class ReceiptWorkflowOut(Schema):
    name: str | None = None
    version: int | None = None


class ReceiptOut(Schema):
    format: str
    run_id: UUID
    workflow: ReceiptWorkflowOut | None = None
    status: Literal["unfinished", "succeeded", "failed", "cancelled"]
    created_at: datetime | None = None
    ended_at: datetime | None = None
    error: dict[str, Any] | None = None
    steps: list[ReceiptStepOut]
    redrives: list[ReceiptRedriveOut]
    retries: list[ReceiptRetryOut]
    approvals: list[ReceiptApprovalOut]
    signals: list[ReceiptSignalOut]
    custom_events: list[ReceiptCustomEventOut]
    totals: ReceiptTotalsOut
    journal: ReceiptJournalOut
    signature: str | None = Field(None, description="null until receipts are signed")


# --- system ---------------------------------------------------------------------------------------


class HealthOut(Schema):
    database: Literal["ok", "error"]
    broker: Literal["ok", "error"]
    last_sweep_at: datetime | None = Field(None, description="when the last recovery sweep finished")


class UnhealthyOut(HealthOut):
    detail: str = Field(..., description="what failed")
    code: Literal["unhealthy"]

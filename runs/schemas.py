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
    forked_from: UUID | None = Field(None, description="the run this one was forked from (POST /runs/{id}/fork)")
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


class BudgetIn(ReasonIn):
    max_cost_usd: float | None = Field(None, gt=0, description="the new cap in USD over the run and its children")
    max_tokens: int | None = Field(None, gt=0, description="the new cap in tokens over the run and its children")


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


class StepSideEffectOut(Schema):
    key: str
    channel: str
    target: str | None = Field(None, description="the URL (credentials removed) or the addresses")
    status: str = Field(..., description="claimed, delivered, failed or unconfirmed")
    claimed_at: datetime
    delivered_at: datetime | None = None
    response: Any = Field(None, description="what the peer answered, when it did")


class StepTryOut(Schema):
    at: datetime
    message: str | None = None
    code: str | None = None


class StepSkipOut(Schema):
    when: str | None = None
    value: Any = Field(None, description="what the expression gave")


class StepAttemptOut(Schema):
    step_id: str = Field(..., description='the journal\'s step id: the step, or an item "{step}[{index}]"')
    attempt: int | None = Field(None, description="null for a skipped step")
    item: int | None = Field(None, description="the item's index in its for_each step's list; null for the step")
    key: str | None = Field(None, description="{run_id}:{step_id}:{attempt}; null for a skipped step")
    status: Literal["running", "waiting", "completed", "failed", "skipped", "interrupted", "cancelled"]
    input: Any = Field(None, description="the step's input after templates, secrets redacted (null: not journaled)")
    output: Any = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    ms: float | None = Field(None, description="how long the attempt's last execution took, in milliseconds")
    tokens: int = Field(..., description="prompt + completion tokens (llm_call, agent)")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    model: str | None = None
    executions: int = Field(..., description="step_started rows of the attempt: more than 1 after a crash")
    tries: list[StepTryOut] = Field(..., description="outcomes not known (timeouts...): the same key tried again")
    waiting_on: Any = None
    reused_from: Any = Field(None, description="a fork's reused step: {run_id, seq} of the original output")
    skipped: StepSkipOut | None = None
    side_effects: list[StepSideEffectOut]
    child_run_id: UUID | None = None
    child_status: RunStatusName | None = None


class StepDetailOut(Schema):
    run_id: UUID
    step_id: str
    kind: str
    needs: list[str]
    items: int | None = Field(None, description="a for_each step's item count, once its items began")
    attempts: list[StepAttemptOut] = Field(..., description="the step's own attempts, then its items' by index")


class PreviewItemFields(Schema):
    """A graph's for_each step and its items (issue 12): absent for the steps of a plain list."""

    item_of: str | None = Field(None, description="an item's for_each step (its step_id is '{step}[{index}]')")
    index: int | None = Field(None, description="an item's place in its for_each step's list")
    items: int | None = Field(None, description="a for_each step's number of items (null before they began)")


class ReusedStepOut(PreviewItemFields):
    step_id: str
    kind: str | None = None
    attempt: int | None = Field(..., description="null for a skipped step")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    skipped: bool = Field(False, description="its `when` was false: the re-drive does not evaluate it again")


class RerunStepOut(PreviewItemFields):
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


class ForkPreviewIn(Strict):
    from_step: str = Field(..., pattern=NAME_PATTERN, description="the first step to run anew; those after it too")
    input: dict[str, Any] | None = Field(None, description="a replacement input (an object); absent: the original's")


class ForkIn(ForkPreviewIn):
    reason: str = Field(..., min_length=1, max_length=2000)


class ForkReusedOut(Schema):
    step_id: str
    kind: str | None = None
    skipped: bool = Field(..., description="its `when` was false in the original: the fork keeps that decision")
    attempt: int | None = Field(..., description="the original's attempt whose outcome is reused (null: skipped)")
    seq: int = Field(..., description="the original's journal row reused (reused_from.seq in the fork)")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    reads_changed_input: list[str] = Field(
        ..., description="changed top-level input fields this step's definition reads: it is reused all the same"
    )


class ForkRerunOut(Schema):
    step_id: str
    kind: str | None = None
    why: str = Field(..., description='"from_step", "after <from_step>" or "no outcome in the original"')


class ForkPreviewOut(Schema):
    run_id: UUID
    workflow: str
    version: int
    from_step: str
    input: dict[str, Any] = Field(..., description="the input the fork would start with")
    input_changed: list[str] = Field(..., description="top-level input fields that differ from the original's")
    reused: list[ForkReusedOut]
    rerun: list[ForkRerunOut]
    saved: SavedOut
    note: str


class BatchRunIn(Strict):
    workflow: str = Field(..., description="workflow name")
    input: dict[str, Any] = Field(default_factory=dict)
    version: int | None = Field(None, ge=1, description="a version of the workflow; the latest if left out")
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=200, description="as the Idempotency-Key header of POST /runs, per run"
    )


class BatchIn(Strict):
    runs: list[BatchRunIn] = Field(..., min_length=1, max_length=500, description="at most 500 runs")


class BatchOut(Schema):
    items: list[RunOut] = Field(..., description="the runs, in the order asked (an idempotent repeat: the same run)")


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


# --- compare (runs.compare) -----------------------------------------------------------------------


class CompareSideOut(Schema):
    status: Literal["completed", "failed", "skipped", "waiting", "running", "interrupted", "not_started"]
    attempt: int | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    ms: int | None = Field(None, description="the current attempt, from its first step_started to its outcome")
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    cost_usd: float
    reused_from: dict[str, Any] | None = Field(None, description="a fork's reused step: {run_id, seq}")
    items: int | None = Field(None, description="a for_each step: how many items (its tokens and cost are theirs)")


class CompareDiffOut(Schema):
    path: str = Field(..., description='where the outputs differ, e.g. "text" or "items[2].name"; "" is the whole')
    change: Literal["changed", "added", "removed"]
    a: Any = None
    b: Any = None


class CompareStepOut(Schema):
    step_id: str
    kind: str | None = None
    item_of: str | None = Field(None, description="an item of this for_each step (step_id is '{step}[{index}]')")
    index: int | None = None
    a: CompareSideOut | None = Field(None, description="null: run a's workflow version has no such step or item")
    b: CompareSideOut | None = None
    same_output: bool | None = Field(None, description="null when neither run has an output for it")
    diff: list[CompareDiffOut]
    diff_cut: bool = Field(False, description="the diff lists only its first paths")


class CompareRunOut(Schema):
    id: UUID
    workflow: str
    version: int
    status: RunStatusName
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class CompareTotalsOut(Schema):
    status: RunStatusName
    ms: int | None = Field(None, description="the run's duration, from its start to its end")
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    cost_usd: float
    steps_completed: int
    steps_failed: int


class CompareRunsOut(Schema):
    a: CompareRunOut
    b: CompareRunOut


class CompareTotalsPairOut(Schema):
    a: CompareTotalsOut
    b: CompareTotalsOut


class CompareOut(Schema):
    runs: CompareRunsOut
    same_workflow: bool
    steps: list[CompareStepOut]
    totals: CompareTotalsPairOut

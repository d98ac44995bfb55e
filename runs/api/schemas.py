"""Request and answer bodies of the REST API (docs/reference/api.md)."""

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema
from pydantic import ConfigDict, StrictInt

from ..errors import ServiceError

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


def errors(*codes: int) -> dict:
    """A call's error answers for its `response=`: each code answers ErrorOut."""
    return {code: ErrorOut for code in codes}


READ = errors(401, 403, 404, 422)
WRITE = errors(400, 401, 403, 404, 409, 413, 422)


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
    attributes: Any = Field(
        None, description='{"NAME": template}: set at the start (input) or when the step they read ends; filterable'
    )


class WorkflowOut(Schema):
    name: str
    version: int
    description: str
    definition: dict[str, Any]
    created_at: datetime


class DivergingOut(Schema):
    run_id: UUID
    version: int = Field(..., description="the version the run walks now")
    step_id: str
    code: str = Field(..., description="gone, kind_changed, input_changed, unrenderable or items_changed")
    why: str


class DefinitionCheckOut(Schema):
    """POST /workflows?dry_run=true: nothing is stored (runs.selectors.definition_divergence)."""

    checked: int = Field(..., description="the runs replayed against the definition")
    diverging: list[DivergingOut]


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


PRIORITY = (
    "-100 to 100, higher sooner (Django's task priority; default 0): its drive messages' broker priority, and the "
    "order a freed concurrency slot or a paced resume takes waiting runs in (then creation order)"
)


class RunIn(Strict):
    workflow: str = Field(..., description="workflow name")
    input: dict[str, Any] = Field(default_factory=dict)
    version: int | None = Field(None, ge=1, description="a version of the workflow; the latest if left out")
    priority: StrictInt | None = Field(None, ge=-100, le=100, description=PRIORITY)


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
    approved: bool | None = Field(
        None, description="approve (true) or reject (false); absent: true when an answer or a choice is given"
    )
    comment: str = Field("", max_length=2000)
    attempt: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="the step attempt this decision is for (waiting_on.attempt); "
        "a decision for another attempt answers 409. Absent: the attempt waiting now",
    )
    arguments: dict[str, Any] | None = Field(
        None,
        description="an agent loop's tool call (approve_tools): the arguments the tool runs with instead of the "
        "model's, checked against the tool's type hints (422 invalid_arguments naming the field)",
    )
    answer: dict[str, Any] | None = Field(
        None,
        description="an approval with a form: the answer, checked against its JSON Schema (422 invalid_answer naming "
        "the field, e.g. answer.amount); it becomes the step's output",
    )
    choice: str | None = Field(
        None, max_length=64, description="an approval with choices: the one picked (422 invalid_answer otherwise)"
    )

    def decision(self) -> bool:
        """Approved or rejected: as given, else approved when an answer or a choice says what."""
        if self.approved is None:
            if self.answer is None and self.choice is None:
                raise ServiceError("approved: is required (true or false)", code="validation_error", status=422)
            return True
        return self.approved


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
    turns: list[dict[str, Any]] | None = Field(
        None,
        description="an agent loop (llm_call with tools): its turns so far, [{turn, key, message, tool_calls:"
        " [{step_id, name, arguments, asked, key, status, result, error, decision}], prompt_tokens,"
        " completion_tokens, cost_usd}]",
    )


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
    priority: StrictInt | None = Field(None, ge=-100, le=100, description=PRIORITY)


class BatchIn(Strict):
    runs: list[BatchRunIn] = Field(..., min_length=1, max_length=500, description="at most 500 runs")


class BatchOut(Schema):
    items: list[RunOut] = Field(..., description="the runs, in the order asked (an idempotent repeat: the same run)")


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


class CompareRunOut(RunBriefOut):  # a compared run: the waterfall's brief, under its own name in the OpenAPI
    pass


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

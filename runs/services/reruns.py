"""Reruns (docs/reference/api.md, "Reruns"): re-run the runs a filter selects, from their failed step or a given
step, as one job named after the incident, per_second runs a second, abortable, journaled on each run it reruns."""

# What a run gets: a failed run is retried in place (runs.services.actions.run_retry: attempt + 1 for its failed
# step, and with a step id that step and every step after it in the graph, with fresh keys and deadlines), so its
# id, journal and receipt stay one story; a run that succeeded or was cancelled is forked from the step
# (runs.services.fork.run_fork: a new run that reuses the steps before it), since it has ended for good. Both are
# decided when the job starts, from each run's status then, and journal the rerun's {id, name} with who and why.
#
# How it goes: the set is fixed at the start, one RerunItem a run, oldest first. A chain of tasks takes turns: a
# turn is one conditional UPDATE of the job's row (still running, this chain's claim, next_at due by the database's
# clock; a paced job moves next_at 1/per_second s on), in the same commit as the item's action and its new status.
# So a worker killed mid-turn rolls all three back, a second chain (the sweep sent the task again) never takes a
# turn of the first's, the pace holds across chains, and an abort (an UPDATE of that row) waits for a turn in flight.

import logging
import re
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Count, DateTimeField, ExpressionWrapper, F
from django.db.models.functions import Greatest

from pal.clock import db_clock, db_now

from .. import search, selectors
from ..audit import Audit
from ..dispatch import enqueue_rerun
from ..errors import Conflict, NotFound, ServiceError
from ..models import Rerun, RerunItem, RerunItemStatus, RerunStatus, Run, RunStatus, Workflow
from ..secrets import mask
from .actions import run_retry, run_retry_preview
from .fork import run_fork, run_fork_preview

log = logging.getLogger("pal.reruns")

RERUN_LIMIT = 10_000  # runs a rerun may cover: a larger incident is several reruns, by time range
PREVIEW_RUNS = 20  # runs a dry run plans one by one (the count covers them all)
MAX_PER_SECOND = 100.0
FILTER_FIELDS = ("workflow", "status", "step_id", "error_code", "created_after", "created_before", "view")
ENDED = (RunStatus.FAILED, RunStatus.SUCCEEDED, RunStatus.CANCELLED)
FAILED = "failed"  # from_step: each run's own failed step
STEP_ID = re.compile(r"^[a-z0-9_-]{1,64}$")


def _invalid(detail: str, code: str = "invalid_filter") -> ServiceError:
    return ServiceError(detail, code=code, status=422)


# --- the filter and the plan -----------------------------------------------------------------------


def rerun_filter(*, filter: Any, from_step: Any, user=None) -> dict[str, Any]:
    """The filter and from_step checked and read into runs.selectors.rerun_runs' arguments (status defaults to
    failed; a view must be one the user sees). 422 naming the first bad field: `filter.status`, `from_step` ..."""
    texts = _texts(filter)
    if not isinstance(from_step, str) or not (from_step == FAILED or STEP_ID.match(from_step)):
        raise _invalid(f'from_step: "failed" or a step id (a-z 0-9 - _), not {from_step!r}', code="unknown_step")
    status = texts.get("status", RunStatus.FAILED)
    if status not in ENDED:
        raise _invalid(f"filter.status: a rerun takes runs that ended: failed, succeeded or cancelled, not {status!r}")
    if from_step == FAILED and status != RunStatus.FAILED:
        raise _invalid(f'filter.status: from_step "failed" reruns failed runs only, not {status} ones')
    found: dict[str, Any] = {"status": status}
    view = filter.get("view") if isinstance(filter, dict) else None
    if view not in (None, ""):
        try:
            found["view"] = selectors.view_get(view_id=view, user=user).id
        except NotFound as exc:
            raise _invalid(f"filter.view: {exc.detail}") from None
    if "workflow" in texts:
        found["workflow"] = _workflow(texts["workflow"], from_step=from_step)
    if "step_id" in texts:
        if not STEP_ID.match(texts["step_id"]):
            raise _invalid(f"filter.step_id: a step id (a-z 0-9 - _), not {texts['step_id']!r}")
        found["step_id"] = texts["step_id"]
    if "error_code" in texts:
        found["error_code"] = search.error_code_text(texts["error_code"], field="filter.error_code")
    for name in ("created_after", "created_before"):
        if name in texts:
            found[name] = search.moment(texts[name], field=f"filter.{name}")
    if found.get("created_after") and found.get("created_before") and found["created_after"] >= found["created_before"]:
        raise _invalid("filter.created_before: must come after created_after")
    return found


def _texts(filter: Any) -> dict[str, str]:
    """The filter's fields that are given, as stripped text; 422 for one that is not a filter or not text."""
    raw = {} if filter is None else filter
    if not isinstance(raw, dict):
        raise _invalid("filter: must be a JSON object")
    unknown = sorted(set(raw) - set(FILTER_FIELDS))
    if unknown:
        raise _invalid(f"filter.{unknown[0]}: not a filter (the filters: {', '.join(FILTER_FIELDS)})")
    texts: dict[str, str] = {}
    for name in FILTER_FIELDS[:-1]:
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise _invalid(f"filter.{name}: must be text")
        if value and value.strip():
            texts[name] = value.strip()
    return texts


def _workflow(name: str, *, from_step: str) -> str:
    latest = Workflow.objects.filter(name=name).order_by("-version").first()
    if latest is None:
        raise _invalid(f"filter.workflow: no workflow is named {name!r}")
    ids = [step.get("id") for step in (latest.definition or {}).get("steps") or []]
    if from_step != FAILED and from_step not in ids:
        raise _invalid(f"from_step: {name} has no step {from_step!r} (its steps: {', '.join(ids)})", "unknown_step")
    return name


def _stored(found: dict[str, Any]) -> dict[str, Any]:
    """The read filter as the job keeps it (JSON: times in ISO 8601, UTC)."""
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in found.items()}


def _per_second(per_second: float | None) -> float | None:
    if per_second is None:
        return None
    number = isinstance(per_second, (int, float)) and not isinstance(per_second, bool)
    if not number or not 0 < per_second <= MAX_PER_SECOND:
        detail = f"per_second: more than 0 and at most {MAX_PER_SECOND:g}, not {per_second!r}"
        raise _invalid(detail, code="invalid_per_second")
    return float(per_second)


def _action_of(status: str) -> str:
    return "retry" if status == RunStatus.FAILED else "fork"


def rerun_plan(*, run: Run, from_step: str) -> dict[str, Any]:
    """What a rerun does to one run: its action (retry in place, or fork) with the steps it reuses and those it runs
    again, from the same plans as the retry and the fork; or why it would be refused."""
    plan: dict[str, Any] = {
        "run_id": str(run.id),
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "status": run.status,
        "failed_step": (run.error or {}).get("step_id") if isinstance(run.error, dict) else None,
        "error_code": (run.error or {}).get("code") if isinstance(run.error, dict) else None,
        "action": _action_of(run.status),
        "reused": [],
        "rerun": [],
        "refused": None,
    }
    try:
        if run.status == RunStatus.FAILED:
            retry = run_retry_preview(run=run, from_step=None if from_step == FAILED else from_step)
            plan.update(reused=retry.reused, rerun=retry.rerun)
        else:
            fork = run_fork_preview(run_id=run.id, from_step=from_step)
            plan.update(reused=fork["reused"], rerun=fork["rerun"])
    except ServiceError as exc:
        plan["refused"] = {"code": exc.code, "detail": exc.detail}
    return plan


def rerun_preview(*, filter: Any, from_step: Any, per_second: float | None = None, user=None) -> dict[str, Any]:
    """A dry run: how many runs the filter selects (and how many each action takes), how long at the pace, and
    for the first PREVIEW_RUNS of them, oldest first, what each would reuse and run again."""
    found = rerun_filter(filter=filter, from_step=from_step, user=user)
    per_second = _per_second(per_second)
    runs = selectors.rerun_runs(**found)
    by_status = dict(runs.order_by().values_list("status").annotate(n=Count("id")))
    count = sum(by_status.values())
    actions = {"retry": by_status.get(RunStatus.FAILED, 0), "fork": count - by_status.get(RunStatus.FAILED, 0)}
    return {
        "count": count,
        "limit": RERUN_LIMIT,
        "too_many": count > RERUN_LIMIT,
        "actions": actions,
        "seconds": round(count / per_second, 3) if per_second else None,
        "filter": _stored(found),
        "from_step": from_step,
        "per_second": per_second,
        "preview": [rerun_plan(run=run, from_step=from_step) for run in runs.select_related("workflow")[:PREVIEW_RUNS]],
    }


# --- the job ---------------------------------------------------------------------------------------


def rerun_start(
    *,
    filter: Any,
    from_step: Any,
    reason: str,
    by: str,
    name: str = "",
    per_second: float | None = None,
    user=None,
) -> Rerun:
    """Start a rerun of the runs the filter selects now (fixed: a run that fails later is not swept in), named
    after the incident (name; the reason when blank). Its task reruns them oldest first, per_second a second
    when given. 422 naming the field; more than RERUN_LIMIT runs: 422 too_many_runs."""
    audit = Audit.of(by=by, reason=reason, action="a rerun")
    found = rerun_filter(filter=filter, from_step=from_step, user=user)
    per_second = _per_second(per_second)
    name = (name or "").strip() or audit.why.strip()
    rows = list(selectors.rerun_runs(**found).values_list("id", "status")[: RERUN_LIMIT + 1])
    if len(rows) > RERUN_LIMIT:
        raise _invalid(
            f"filter: more than {RERUN_LIMIT} runs match; narrow it (a time range) and start several reruns",
            code="too_many_runs",
        )
    with transaction.atomic():
        rerun = Rerun.objects.create(
            name=name[:200],
            filter=_stored(found),
            from_step=from_step,
            reason=audit.why,
            by=audit.by,
            per_second=per_second,
            count=len(rows),
            claim=uuid.uuid4().hex,
            status=RerunStatus.RUNNING if rows else RerunStatus.DONE,
            finished_at=None if rows else db_clock(),
        )
        RerunItem.objects.bulk_create(
            [
                RerunItem(rerun=rerun, position=position, run_id=run_id, action=_action_of(status))
                for position, (run_id, status) in enumerate(rows)
            ],
            batch_size=1000,
        )
        if rows:
            enqueue_rerun(rerun_id=rerun.id, claim=rerun.claim)
    rerun.refresh_from_db()  # its times are the database's clock
    return rerun


def rerun_abort(*, rerun_id, by: str, reason: str) -> Rerun:
    """Stop a running rerun: the runs it has not reached are left as they are (a turn in flight ends first).
    409 rerun_ended when it is done or aborted already."""
    audit = Audit.of(by=by, reason=reason, action="an abort")
    rerun = selectors.rerun_get(rerun_id=rerun_id)
    stopped = Rerun.objects.filter(id=rerun.id, status=RerunStatus.RUNNING).update(
        status=RerunStatus.ABORTED,
        finished_at=db_clock(),
        updated_at=db_clock(),
        aborted_by=audit.by,
        abort_reason=audit.why,
    )
    rerun.refresh_from_db()
    if not stopped:
        raise Conflict(f"rerun {rerun.id} is {rerun.status}: only a running rerun can be aborted", code="rerun_ended")
    return rerun


def rerun_advance(*, rerun_id, claim: str) -> None:
    """The task's body: take the job's turns that are due, one run each, for at most PAL_SLICE_SECONDS; then send
    the task again for the next turn (a paced job: when it is due). A chain whose claim was taken over stops."""
    job = Rerun.objects.filter(id=rerun_id).values("per_second").first()
    if job is None:
        return
    ends = time.monotonic() + settings.PAL_SLICE_SECONDS
    while time.monotonic() < ends:
        with transaction.atomic():
            if not _turn_take(rerun_id, claim, job["per_second"]):
                break
            pending = RerunItem.objects.filter(rerun_id=rerun_id, status=RerunItemStatus.PENDING).order_by("position")
            item = pending.first()
            if item is not None:
                _item_rerun(Rerun.objects.get(id=rerun_id), item)
            if not pending.exists():  # that was the last: the job is done in the same commit
                Rerun.objects.filter(id=rerun_id).update(
                    status=RerunStatus.DONE, finished_at=db_clock(), updated_at=db_clock()
                )
                return
    _chain_on(rerun_id, claim)


def _turn_take(rerun_id, claim: str, per_second: float | None) -> bool:
    """Inside the turn's transaction: take the job's next turn (its row stays locked until the commit)."""
    fields: dict[str, Any] = {"updated_at": db_clock()}
    if per_second:
        # From the turn that was due, or from now when this one came late: a late chain does not catch up in a burst.
        after = Greatest(F("next_at"), db_clock()) + timedelta(seconds=1 / per_second)
        fields["next_at"] = ExpressionWrapper(after, output_field=DateTimeField())
    due = Rerun.objects.filter(id=rerun_id, claim=claim, status=RerunStatus.RUNNING, next_at__lte=db_clock())
    return due.update(**fields) == 1


def _item_rerun(rerun: Rerun, item: RerunItem) -> None:
    """Inside the turn's transaction: rerun one run by its service, and record what became of it."""
    via = {"id": str(rerun.id), "name": rerun.name}
    step = None if rerun.from_step == FAILED else rerun.from_step
    outcome: dict[str, Any] = {"status": RerunItemStatus.RERUN}
    try:
        with transaction.atomic():  # a refusal undoes only what its own service wrote
            if item.action == "retry":
                run_retry(run_id=item.run_id, by=rerun.by, reason=rerun.reason, from_step=step, rerun_job=via)
            else:
                fork = run_fork(
                    run_id=item.run_id, from_step=rerun.from_step, reason=rerun.reason, by=rerun.by, rerun_job=via
                )
                outcome["fork_run_id"] = fork.id
    except DatabaseError:
        raise  # the turn rolls back whole; the sweep sends the task again
    except ServiceError as exc:
        outcome = {"status": RerunItemStatus.REFUSED, "code": exc.code, "detail": exc.detail}
    except Exception as exc:  # our own bug on one run must not stall the job for the others
        log.exception("rerun %s could not rerun run %s", rerun.id, item.run_id)
        detail = mask(f"{type(exc).__name__}: {exc}")[:500]  # an error's text may quote a secret
        outcome = {"status": RerunItemStatus.REFUSED, "code": "internal_error", "detail": detail}
    if not RerunItem.objects.filter(id=item.id, status=RerunItemStatus.PENDING).update(done_at=db_clock(), **outcome):
        raise Conflict(f"rerun {rerun.id}: run {item.run_id} was taken by another turn", code="rerun_ended")
    refused = 1 if outcome["status"] == RerunItemStatus.REFUSED else 0
    Rerun.objects.filter(id=rerun.id).update(done=F("done") + 1, refused=F("refused") + refused)


def _chain_on(rerun_id, claim: str) -> None:
    """Send this chain's next task: when the next turn is due, or at once after a slice used up. Nothing when the
    job is over or another chain holds it."""
    job = Rerun.objects.filter(id=rerun_id, claim=claim, status=RerunStatus.RUNNING).values("next_at").first()
    if job is None:
        return
    wait = max((job["next_at"] - db_now()).total_seconds(), 0.0)
    enqueue_rerun(rerun_id=rerun_id, claim=claim, countdown=wait)  # lost: the sweep sends it again

"""Receipts over a run's tree, signed; and verification of a run (pal_verify) or of a saved receipt."""

# run_receipt(run_id) composes journal.receipts.receipt_build with what only the run rows know: the parent, the
# journal head recorded when the run ended, each llm_call's model as the workflow asked for it, and the child
# runs as nested receipts (each with its own totals and tree_totals), then signs the whole with
# settings.PAL_RECEIPT_PRIVATE_KEY (journal.receipts says exactly how). Children are not signed on their own:
# the root's signature covers them.
#
# Costs: each attempt's tokens and cost_usd by the one rule of spend (runs.spend, which budgets and compare use too):
# what an llm_call's output recorded when it ran, a usage without a cost priced now, a fork's reused step nothing.
# totals are the run's own steps with the items of its for_each steps (each item counted once, under its step; the
# for_each step's own output, the list of its items' outputs, is not counted again); tree_totals add every
# descendant's.
#
# run_verify(run_id) is `pal_verify RUN_ID`: the chain of the run and of every descendant, recomputed from the
# database against the head its run row recorded, and the run rows against a freshly built receipt (status,
# output, children, side effects). receipt_file_verify is `pal_verify --file`: the signature over the canonical
# form and the receipt's own sums, offline; with a run id too, the database's chains must still contain the
# heads the receipt holds.

from dataclasses import dataclass, field
from decimal import Decimal
from typing import cast

from django.conf import settings

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.receipts import attempts_of, decimal_text, receipt_build, receipt_sign, signature_problem
from journal.services import dumps

from .models import FINAL_STATUSES, Run, RunStatus, SideEffect
from .services import run_get
from .spend import attempt_spend, step_of, steps_by_id

TREE_TOTAL_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "side_effects", "attempts")


def run_receipt(*, run_id, sign: bool = True) -> dict:
    """The receipt of a run and its child tree; signed when a key is configured. Raises NotFound."""
    receipt = _compose(run_get(run_id=run_id), depth=0)
    key = settings.PAL_RECEIPT_PRIVATE_KEY
    if sign and key is not None:
        receipt_sign(receipt, key)
    return receipt


def _compose(run: Run, *, depth: int) -> dict:
    definition = steps_by_id(run.workflow.definition)
    receipt = receipt_build(run_id=run.id, spend=_spend_of(definition))
    for step in attempts_of(receipt["steps"]):
        declared = step_of(definition, step["step_id"]) or {}
        if step["status"] == "skipped" and step["kind"] is None:
            step["kind"] = declared.get("kind")  # step_skipped does not journal it
        if isinstance(declared.get("model"), str):
            step["model"] = declared["model"]
    receipt["parent"] = (
        {"run_id": str(run.parent_run_id), "step_id": run.parent_step_id, "attempt": run.parent_attempt}
        if run.parent_run_id
        else None
    )
    receipt["depth"] = run.depth
    receipt["created_by"] = run.created_by
    receipt["journal"]["recorded_head"] = (
        {"seq": run.journal_head_seq, "hash": run.journal_head_hash} if run.journal_head_seq is not None else None
    )
    children = []
    if depth <= 100:  # PAL_MAX_CHILD_DEPTH bounds a tree far below this; a cycle in forged rows must not loop
        for child in Run.objects.select_related("workflow").filter(parent_run_id=run.id).order_by("created_at", "id"):
            nested = _compose(child, depth=depth + 1)
            nested.pop("signed", None)
            nested.pop("signature", None)
            children.append(nested)
    receipt["children"] = children
    receipt["tree_totals"] = tree_totals(receipt["totals"], [c["tree_totals"] for c in children])
    # The signature fields go last, for the reader's eye (the canonical form sorts keys anyway).
    receipt["signed"] = receipt.pop("signed", None)
    receipt["signature"] = receipt.pop("signature", None)
    return receipt


def _spend_of(definition: dict[str, dict]):
    """The receipt's count of each completed attempt: the one rule of spend (runs.spend), with the declared step."""

    def spend(step_id: str, kind: str | None, output, reused: bool) -> tuple[int, int, float]:
        spent = attempt_spend(step_of(definition, step_id) or {"kind": kind}, output, reused=reused)
        return spent.prompt_tokens, spent.completion_tokens, spent.cost_usd

    return spend


def tree_totals(own: dict, children: list[dict]) -> dict:
    totals = {"runs": 1 + sum(c["runs"] for c in children)}
    for key in TREE_TOTAL_KEYS:
        totals[key] = own[key] + sum(c[key] for c in children)
    totals["cost_usd"] = decimal_text(
        Decimal(own["cost_usd"]) + sum((Decimal(c["cost_usd"]) for c in children), Decimal(0))
    )
    return totals


# --- checks ---------------------------------------------------------------------------------------


@dataclass
class Problem:
    run_id: str
    reason: str
    seq: int | None = None

    def __str__(self):
        return f"run {self.run_id}: {self.reason}"


@dataclass
class Verified:
    ok: bool
    runs: int = 0
    events: int = 0
    head_seq: int = 0
    head_hash: str = ""
    notes: list[str] = field(default_factory=list)
    problem: Problem | None = None


def run_verify(*, run_id) -> Verified:
    """Recompute the chains of a run's tree and check them against the recorded heads and a fresh receipt."""
    root = run_get(run_id=run_id)
    result = Verified(ok=True)
    pending = [root]
    seen = set()
    while pending:
        run = pending.pop(0)
        if run.id in seen:
            continue
        seen.add(run.id)
        problem, report = _verify_one(run, result)
        if problem is not None:
            result.ok, result.problem = False, problem
            return result
        result.runs += 1
        result.events += report.count
        if run.id == root.id:
            result.head_seq, result.head_hash = report.head_seq, report.head_hash
        pending += list(
            Run.objects.select_related("workflow").filter(parent_run_id=run.id).order_by("created_at", "id")
        )
    return result


def _verify_one(run: Run, result: Verified):
    rid = str(run.id)
    if run.journal_head_seq is not None:
        # An ended run's journal ends at its recorded head; a failed run that was retried goes on past it.
        report = chain_verify(
            run_id=run.id, expect_head=(run.journal_head_seq, run.journal_head_hash), exact=run.status in FINAL_STATUSES
        )
    else:
        report = chain_verify(run_id=run.id)
        if run.status in FINAL_STATUSES and report.ok:
            return Problem(
                rid,
                f"the run has ended ({run.status}) but its row records no journal head "
                f"(the row was altered), so a cut-off end could not be seen",
                None,
            ), report
        if report.ok:
            result.notes.append(
                f"run {rid} has not ended: its chain holds, but rows cut off its end cannot be seen before it ends"
            )
    if not report.ok:
        return Problem(rid, report.reason, report.first_bad_seq), report
    return _agrees_with_receipt(run), report


def _agrees_with_receipt(run: Run) -> Problem | None:
    """The run rows against the receipt the journal gives now."""
    rid = str(run.id)
    receipt = receipt_build(run_id=run.id, spend=_spend_of(steps_by_id(run.workflow.definition)))
    journal_status = receipt["status"]
    row_status = run.status if run.status in FINAL_STATUSES else "unfinished"
    final = (
        JournalEvent.objects.filter(
            run_id=run.id, kind__in=("run_succeeded", "run_failed", "run_cancelled", "run_retried")
        )
        .order_by("-seq")
        .first()
    )
    if journal_status != row_status:
        return Problem(
            rid,
            f"the run row says {run.status} but its journal says {journal_status}"
            + (f" (seq {final.seq}, {final.kind})" if final else ""),
            final.seq if final else None,
        )
    if run.status == RunStatus.SUCCEEDED and final is not None and final.kind == "run_succeeded":
        if dumps((final.payload or {}).get("output")) != dumps(run.output):
            return Problem(rid, f"the run row's output differs from the output journaled at seq {final.seq}", final.seq)
    journaled_children = {s["child_run_id"] for s in attempts_of(receipt["steps"]) if s["child_run_id"]}
    row_children = {str(i) for i in Run.objects.filter(parent_run_id=run.id).values_list("id", flat=True)}
    if row_children - journaled_children:
        return Problem(rid, f"child run {sorted(row_children - journaled_children)[0]} is not in the journal")
    effects = {e["key"]: e for s in attempts_of(receipt["steps"]) for e in s["side_effects"]}
    for key, status in SideEffect.objects.filter(run_id=run.id).values_list("key", "status"):
        effect = effects.get(key)
        if effect is None:
            return Problem(rid, f"side effect {key} has no side_effect_claimed in the journal")
        if effect["status"] != status:
            return Problem(
                rid,
                f"side effect {key} is {status} but the journal says {effect['status']} (seq {effect['seq']})",
                effect["seq"],
            )
    return None


def receipt_consistency_problem(receipt: dict, *, path: str = "") -> str | None:
    """The receipt's own sums: totals over its steps (and their items), tree_totals over its children,
    recursively."""
    where = path or f"run {receipt.get('run_id')}"
    try:
        steps, totals = list(attempts_of(receipt["steps"])), receipt["totals"]
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            if sum(s[key] for s in steps) != totals[key]:
                return f"{where}: totals.{key} is not the sum over its steps"
        if sum((Decimal(s["cost_usd"]) for s in steps), Decimal(0)) != Decimal(totals["cost_usd"]):
            return f"{where}: totals.cost_usd is not the sum over its steps"
        children = receipt.get("children") or []
        for index, child in enumerate(children):
            problem = receipt_consistency_problem(child, path=f"{where} > child {index + 1} ({child.get('run_id')})")
            if problem:
                return problem
        expected = tree_totals(totals, [c["tree_totals"] for c in children])
        for key, value in expected.items():
            got = receipt["tree_totals"][key]
            if (Decimal(got) != Decimal(value)) if key == "cost_usd" else (got != value):
                return f"{where}: tree_totals.{key} is not its totals plus its children's"
    except (KeyError, TypeError, AttributeError, ArithmeticError, ValueError) as exc:
        return f"{where}: not a receipt of this format ({type(exc).__name__}: {exc})"
    return None


def receipt_file_verify(receipt, public_key) -> str | None:
    """Offline: why a saved receipt does not hold (signature, then its sums), or None."""
    return signature_problem(receipt, public_key) or receipt_consistency_problem(receipt)


def receipt_against_database(receipt: dict) -> Problem | None:
    """The database's chains must still contain every head the receipt holds (a journal rewritten with fresh
    hashes and a forged run row pass the chain check; they cannot match a receipt signed before)."""
    pending = [receipt]
    while pending:
        node = pending.pop(0)
        rid, journal = node.get("run_id"), node.get("journal") or {}
        if not isinstance(rid, str):
            return Problem(str(rid), "the receipt names no run id")
        if not Run.objects.filter(id=rid).exists():
            return Problem(str(rid), "the run is not in the database")
        report = chain_verify(
            run_id=rid,
            expect_head=cast(tuple[int, str], (journal.get("head_seq", 0), journal.get("head_hash"))),
            exact=False,
        )
        if not report.ok:
            reason = report.reason.replace("recorded head", "receipt's head")
            return Problem(str(rid), reason, report.first_bad_seq)
        pending += node.get("children") or []
    return None

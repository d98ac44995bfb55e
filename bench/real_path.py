"""A through a real worker (issue 29 section 1): the path users get, beside A's walk in one process.

The same workflow of no-op steps as A's `run_drive` row, created through the service (as the API does) and walked by
ONE `celery -A pal worker --pool solo` with the default settings (PAL_SLICE_SECONDS unset: a slice of 2 s, then the
run is handed to a new task, which takes the lease, reads the run and replays the journal so far). Per step: the
journal's run_created to run_succeeded over the steps. The hand-offs are found in the journal: a slice's rows carry
its lease epoch, and each hand-off gives the run a new one, so a slice's first row is the first row of a new epoch;
a hand-off's cost is the gap from the row before it. What a hand-off reads is then timed in this process, with the
worker stopped: the run with its workflow, and `replay(replay_rows_for_run(...))` of the run's journal cut at
1,000, 5,000, 10,000 and 20,000 rows (a copy of its first rows under another run id).
"""

from __future__ import annotations

import itertools
import os
import time

from bench import common
from bench.common import median

VARIANT = "celery worker"
COMMIT_EACH = "a commit per step"


def variant(steps: int, commit_each: bool = False) -> str:
    """A's row name for a run of `steps` steps through the worker (`commit_each`: PAL_PURE_BATCH_MS=0)."""
    name = VARIANT if steps == 1000 else f"{VARIANT}, {steps:,} steps"
    return f"{name}, {COMMIT_EACH}" if commit_each else name


def through_a_worker(steps: int, repeats: int, replay_rows: list[int] | None = None, commit_each: bool = False) -> dict:
    """A through a worker: `repeats` runs of `steps` echo steps on one real worker with default settings (with
    `commit_each`, PAL_PURE_BATCH_MS=0). Values: seconds per step (run_created to run_succeeded / steps);
    details: each run's slices and hand-offs, and what a hand-off reads at `replay_rows` rows of the journal."""
    os.environ.pop("PAL_SLICE_SECONDS", None)  # the default slice, in this process and the worker (child_env)
    worker_env = common.ours_env() | ({"PAL_PURE_BATCH_MS": "0"} if commit_each else {})
    common.django_setup()
    from django.conf import settings

    from bench.ours import _noop_workflow, _wait_finished
    from pal.celery import app
    from runs import services

    _noop_workflow("bench-a-worker", steps)
    _noop_workflow("bench-warm", 20)
    runs, figures = [], []
    with common.celery_workers(app, "pal", 1, env=worker_env, name="a-worker"):
        warm = [services.run_create(workflow_name="bench-warm")[0].id for _ in range(3)]
        _wait_finished(warm, 60)
        for _ in range(repeats):
            run, _ = services.run_create(workflow_name="bench-a-worker")
            _wait_finished([run.id], 20 + steps * 0.01)
            run.refresh_from_db()
            assert run.status == "succeeded", run.error
            walked = journal_slices(run.id, steps)
            runs.append(walked)
            figures.append(walked["run_seconds"] / steps)
            print(f"A worker {steps} steps: {_summary(walked)}", flush=True)
    reads = handoff_reads(run.id, replay_rows or []) if replay_rows else {}
    if reads:
        print(f"A worker: what a hand-off reads: {reads}", flush=True)
    details = {"steps": steps, "slice_seconds": settings.PAL_SLICE_SECONDS, "runs": runs, "reads": reads}
    return {"values": figures, "details": details}


def _summary(walked: dict) -> str:
    gaps = [h["gap_ms"] for h in walked["handoffs"]]
    return (
        f"{walked['run_seconds']:.2f} s, {len(walked['slices'])} slices, hand-offs {gaps} ms "
        f"({walked['handoff_share'] * 100:.1f} % of the run)"
    )


def journal_slices(run_id, steps: int) -> dict:
    """The run's walk as its journal tells it: run time, the first pick-up, each slice (rows, seconds) and each
    hand-off (the journal's rows before it, the gap in ms from its slice's last row to the next one's first)."""
    from journal.models import JournalEvent

    rows = list(
        JournalEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "kind", "epoch", "created_at")
    )
    kinds = {kind: created for _, kind, _, created in rows if kind in ("run_created", "run_started", "run_succeeded")}
    run_seconds = (kinds["run_succeeded"] - kinds["run_created"]).total_seconds()
    walked = [row for row in rows if row[1] != "run_created"]
    slices: list[list[tuple]] = []
    for row in walked:
        if slices and slices[-1][-1][2] == row[2]:
            slices[-1].append(row)
        else:
            slices.append([row])
    handoffs = [
        {"rows_before": before[-1][0], "gap_ms": round((after[0][3] - before[-1][3]).total_seconds() * 1000, 2)}
        for before, after in itertools.pairwise(slices)
    ]
    handoff_seconds = sum(h["gap_ms"] for h in handoffs) / 1000
    return {
        "journal_rows": len(rows),
        "run_seconds": round(run_seconds, 3),
        "pickup_ms": round((kinds["run_started"] - kinds["run_created"]).total_seconds() * 1000, 2),
        "slices": [
            {"rows": len(s), "seconds": round((s[-1][3] - s[0][3]).total_seconds(), 3), "epoch": s[0][2]}
            for s in slices
        ],
        "handoffs": handoffs,
        "handoff_seconds": round(handoff_seconds, 3),
        "handoff_share": handoff_seconds / run_seconds if run_seconds else 0.0,
    }


def _timed(fn, times: int = 5) -> tuple[float, object]:
    """(median ms over `times` calls after one warm-up, the last call's result)."""
    out = fn()
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        out = fn()
        spent.append((time.perf_counter() - started) * 1000)
    return round(median(spent), 2), out


def handoff_reads(run_id, sizes: list[int]) -> dict:
    """What the next slice does before its first step, timed here: read the run with its workflow (every step's
    definition decoded), build the steps' graph (runs.graph: needs_of and order, as the walk's scheduler does), and
    the replay's read and fold of the journal's first n rows for each n in `sizes` that the journal holds, each a
    copy of those rows under a new run id, read by replay_rows_for_run."""
    import uuid

    from django.db import connection

    from journal.models import JournalEvent
    from journal.selectors import replay_rows_for_run
    from runs.graph import needs_of, order
    from runs.models import Run
    from runs.replay import replay

    total = JournalEvent.objects.filter(run_id=run_id).count()
    run_ms, run = _timed(lambda: Run.objects.select_related("workflow").get(id=run_id))
    steps = run.workflow.definition["steps"]
    graph_ms, _ = _timed(lambda: (needs_of(steps), order(steps)))
    out: dict = {"run_read_ms": run_ms, "graph_ms": graph_ms, "journal_rows": total, "replay": []}
    columns = "seq, kind, step_id, attempt, payload, created_at, writer, epoch, prev_hash, hash"
    for n in sorted(n for n in sizes if n <= total):
        copy = uuid.uuid4()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO journal_events (run_id, {columns}) SELECT %s, {columns} FROM journal_events "
                "WHERE run_id = %s AND seq <= %s",
                [copy, run_id, n],
            )
        read_ms, rows = _timed(lambda copy=copy: replay_rows_for_run(run_id=copy))
        fold_ms, _ = _timed(lambda rows=rows: replay(rows))
        out["replay"].append({"rows": len(rows), "read_ms": read_ms, "fold_ms": fold_ms})
    return out


# --- docs/PERFORMANCE.md -----------------------------------------------------------------------------------------


def _worker_rows(results: list[dict]) -> list[dict]:
    return [
        r
        for r in results
        if r["scenario"] == "A" and r["side"] == "ours" and r["variant"].startswith(VARIANT) and r["status"] == "ok"
    ]


def _walks(r: dict) -> list[dict]:
    return [walk for d in r.get("details", []) for walk in d.get("runs", [])]


def summary_line(r: dict) -> str:
    """The terminal's line for a worker row: per step, and the hand-offs of its runs."""
    walks = _walks(r)
    gaps = [h["gap_ms"] for walk in walks for h in walk["handoffs"]]
    share = median([walk["handoff_share"] for walk in walks]) * 100 if walks else 0.0
    return (
        f"median {median(r['values']) * 1000:.2f} ms/step over {len(r['values'])}; {len(gaps)} hand-offs, median "
        f"{median(gaps) if gaps else 0:.1f} ms, {share:.1f} % of a run ({r['wall_seconds']} s)"
    )


def report_section(results: list[dict]) -> list[str]:
    """Under A's table: each worker row against the walk in one process, its slices and hand-offs, and what one
    hand-off reads as the journal grows."""
    rows = _worker_rows(results)
    if not rows:
        return []
    inline = next(
        (r for r in results if r["scenario"] == "A" and r["variant"] == "run_drive" and r["status"] == "ok"), None
    )
    out = [
        "### A through a worker: per step, and the hand-offs",
        "",
        "| run | ms per step | × the walk in one process | slices a run | hand-offs | ms per hand-off (median; "
        "the last of each run) | hand-offs' share of the run | first pick-up ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    last_row: dict = {}
    for r in rows:
        walks = _walks(r)
        per_step = median(r["values"]) * 1000
        times = f"{median(r['values']) / median(inline['values']):.2f}×" if inline else "–"
        gaps = [h["gap_ms"] for walk in walks for h in walk["handoffs"]]
        last = [walk["handoffs"][-1] for walk in walks if walk["handoffs"]]
        shares = [walk["handoff_share"] * 100 for walk in walks]
        last_text = "; ".join(f"{h['gap_ms']:.1f} after {h['rows_before']:,} rows" for h in last)
        label = f"{r['kwargs']['steps']:,} steps{', ' + COMMIT_EACH if r['kwargs'].get('commit_each') else ''}"
        out.append(
            f"| {label} | {per_step:.2f} | {times} | "
            f"{', '.join(str(len(walk['slices'])) for walk in walks)} | {len(gaps)} | "
            f"{f'{median(gaps):.1f}' if gaps else '–'}{f'; {last_text}' if last_text else ''} | "
            f"{', '.join(f'{s:.1f} %' for s in shares)} | {', '.join(f'{walk["pickup_ms"]:.0f}' for walk in walks)} |"
        )
        steps = r["kwargs"]["steps"]
        if last and (not last_row or steps > last_row["row"]["kwargs"]["steps"]):
            last_row = {"row": r, "walks": walks, "last": last}  # the largest run that made a hand-off
    out.append("")
    found = next((d for r in rows for d in r.get("details", []) if d.get("reads")), None)
    reads = found["reads"] | {"steps": found["steps"]} if found else None
    if reads:
        out += [
            "What a hand-off reads before its slice's first step, timed in the bench process (median of 5 after a "
            f"warm-up): the run with its workflow ({reads['steps']:,} steps' definition decoded) "
            f"{reads['run_read_ms']:.1f} ms, the steps' graph (`runs.graph.needs_of` and `order`) "
            f"{reads.get('graph_ms', 0.0):.1f} ms, and the replay of the journal:",
            "",
            "| journal rows | read (`replay_rows_for_run`) ms | fold (`replay`) ms | together ms |",
            "|---|---|---|---|",
        ]
        for x in reads["replay"]:
            out.append(
                f"| {x['rows']:,} | {x['read_ms']:.1f} | {x['fold_ms']:.1f} | {x['read_ms'] + x['fold_ms']:.1f} |"
            )
        out.append("")
        out += _verdict(last_row, reads)
    return out


def _replay_at(reads: dict, rows: int) -> float:
    """The replay's read and fold in ms at `rows` rows: linear between the sizes timed (it is one pass over them)."""
    points = sorted((x["rows"], x["read_ms"] + x["fold_ms"]) for x in reads["replay"])
    below = [p for p in points if p[0] <= rows] or points[:1]
    above = [p for p in points if p[0] >= rows] or points[-1:]
    (r0, t0), (r1, t1) = below[-1], above[0]
    return t0 if r1 == r0 else t0 + (t1 - t0) * (rows - r0) / (r1 - r0)


def _verdict(last_row: dict, reads: dict) -> list[str]:
    """One sentence: what one hand-off costs at the largest run, and the hand-offs' share of its time."""
    if not last_row or not last_row["last"]:
        return ["No run made a hand-off.", ""]
    walks, last = last_row["walks"], last_row["last"]
    steps = last_row["row"]["kwargs"]["steps"]
    gap = median([h["gap_ms"] for h in last])
    rows_before = round(median([h["rows_before"] for h in last]))
    replay_ms = _replay_at(reads, rows_before)
    known = replay_ms + reads["run_read_ms"] + reads.get("graph_ms", 0.0)
    spent = median([walk["handoff_seconds"] for walk in walks])
    total = median([walk["run_seconds"] for walk in walks])
    return [
        f"At {steps:,} steps one hand-off costs {gap:.0f} ms (the journal's gap at a run's last hand-off, after "
        f"{rows_before:,} rows). Of that, timed in the bench process: the replay of {rows_before:,} rows about "
        f"{replay_ms:.0f} ms (between the sizes above), the run with its workflow {reads['run_read_ms']:.0f} ms and "
        f"the steps' graph {reads.get('graph_ms', 0.0):.0f} ms, {known:.0f} ms together; the other {gap - known:.0f} "
        "ms are the old slice's last commit, the new task's trip through Redis, the lease, the walk's set-up over "
        "the definition and the replayed steps, and the first step's commit. The "
        f"hand-offs took {spent:.2f} s of the {total:.2f} s run ({spent / total * 100:.1f} %).",
        "",
    ]

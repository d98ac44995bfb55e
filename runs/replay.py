"""The journal folded into each step's state: what a walk, a re-drive preview and an operator's decision read."""

# A step's key is `{run}:{step}:{attempt}`, an item's of a for_each step `{run}:{step}[{index}]:{attempt}`: an item
# is journaled under the step id `{step}[{index}]`, so it folds here like any step (docs/reference/keys.md). The
# attempt is the journal's, so a re-drive of an attempt that started before a crash runs it again under the same
# key, and only a definite failure (or an operator's retry of one) makes a new attempt.

from dataclasses import dataclass, field
from typing import Any

from journal.selectors import REMEMBERED_KINDS

MISSING: Any = object()  # a step attempt with no output yet (None is an output)


def step_key(run_id, step_id: str, attempt: int) -> str:
    return f"{run_id}:{step_id}:{attempt}"


def item_id(step_id: str, index: int) -> str:
    """The journal's step id of one item of a for_each step."""
    return f"{step_id}[{index}]"


@dataclass
class StepState:
    attempt: int = 1
    started: bool = False  # the current attempt has a step_started
    output: Any = MISSING  # the current attempt's step_completed output
    failure: dict | None = None  # the current attempt's step_failed payload
    waiting: bool = False  # the current attempt parked the run (run_waiting) and has not started again since
    unknown_tries: int = 0  # step_retrying events of the current attempt: outcomes we could not know
    failed_tries: int = 0  # step_failed events since the step began (or since an operator's retry): max_attempts
    events: dict = field(default_factory=dict)  # the current attempt's last payload of each other kind
    skipped: bool = False  # step_skipped: its `when` was false (output None)


REMEMBERED = REMEMBERED_KINDS  # the journal app's one list of the kinds a step reads back on replay


def replay(rows) -> dict[str, StepState]:
    """Fold the journal's rows (journal.selectors.ReplayRow, in seq order) into each step's current attempt and
    outcome."""
    states: dict[str, StepState] = {}
    for row in rows:
        step_id, kind, attempt, payload = row.step_id, row.kind, row.attempt, row.payload
        if step_id is None:
            continue
        state = states.setdefault(step_id, StepState())
        if kind == "step_started":
            if attempt != state.attempt or state.failure is not None:
                state.output, state.failure, state.events, state.unknown_tries = MISSING, None, {}, 0
            state.attempt, state.started, state.waiting = attempt, True, False
        elif kind == "step_retrying" and attempt == state.attempt:
            state.unknown_tries += 1
        elif kind in REMEMBERED and attempt == state.attempt:
            state.events[kind] = payload or {}
            if kind in ("run_waiting", "child_sliced"):
                state.waiting = True  # the attempt goes on where it stopped: no second step_started, no adoption
        elif kind == "step_completed" and attempt == state.attempt:
            state.output = (payload or {}).get("output")
        elif kind == "step_skipped":
            state.output, state.skipped = None, True  # its `when` was false: the steps that need it still run
        elif kind == "step_failed" and attempt == state.attempt:
            state.failure = payload or {}
            state.failed_tries += 1
        elif kind == "definition_moved":
            # The run moved to another version of its workflow, where this step runs again under the attempt the row
            # names (a new key) or is gone (runs.services.move): its outcome is dropped, as a retry's is. The move's
            # own row (no step) is skipped above.
            state.attempt, state.started, state.output, state.failure = (
                attempt or state.attempt + 1,
                False,
                MISSING,
                None,
            )
            state.events, state.waiting, state.failed_tries, state.unknown_tries = {}, False, 0, 0
            state.skipped = False
        elif kind == "run_retried":
            # An operator's retry: the failed step goes on with attempt + 1 (new key), or with the same attempt and
            # key when its outcome was unknown (runs.services.run_retry chose which and journaled it). A retry from a
            # step (a rerun) journals one for each step after it too: a completed or skipped one runs again.
            same = attempt == state.attempt
            state.attempt, state.started, state.output, state.failure = (
                (attempt or state.attempt + 1),
                same,
                MISSING,
                None,
            )
            state.events, state.waiting, state.failed_tries, state.unknown_tries = {}, False, 0, 0
            state.skipped = False
    return states

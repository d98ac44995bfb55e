"""Tools and a Python workflow for the pure-step tests (PAL_WORKFLOW_MODULES=tests.code.pure_tools for their
workers): each real run appends {tool, key, pure, pid} to PAL_TEST_CALLS_FILE (when set) and to CALLS, so a test
counts what ran again."""

import json
import os
import time

from pal.tools import tool
from pal.workflows import current_step, step, workflow
from runs.steps.base import StepContext

CALLS: list[dict] = []


def _ran(name: str, ctx: StepContext, pure: bool) -> None:
    line = {"tool": name, "key": ctx.key, "step_id": ctx.step_id, "pure": pure, "pid": os.getpid()}
    CALLS.append(line)
    path = os.environ.get("PAL_TEST_CALLS_FILE")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


@tool(name="count_pure", pure=True)
def count_pure(n: int, ctx: StepContext, nap: float = 0.0) -> dict:
    """Pure: it changes nothing outside the database (it only notes that it ran, for the test)."""
    time.sleep(nap)
    _ran("count_pure", ctx, True)
    return {"n": n}


@tool(name="count_effect")
def count_effect(n: int, ctx: StepContext) -> dict:
    """An effect (not pure): the journal must say it started before it runs, and that it ended before anything
    after it runs."""
    _ran("count_effect", ctx, False)
    return {"n": n}


@step(name="p", pure=True)
def pure_step(n: int, nap: float = 0.0) -> dict:
    """A @step(pure=True): the Python workflow's counterpart of count_pure."""
    time.sleep(nap)
    _ran("p", current_step(), True)
    return {"n": n}


@workflow(name="pure-rounds")
def pure_rounds(ctx, input):
    """Rounds of pure @step calls, each round closed by two effects: a tool that is not pure and a webhook."""
    for r in range(input["rounds"]):
        for i in range(input["pure"]):
            pure_step(i, input.get("nap", 0.0))
        ctx.tool("count_effect", id="effect", n=r)
        if input.get("hook"):
            ctx.webhook(url=input["hook"], body={"round": r}, id="hook")
    return {"rounds": input["rounds"]}

"""Faults for real workers of tests/durability/test_walk_failures.py, which start them with `--include` of this
module: a tool whose output is not JSON, and (with PAL_TEST_WALK_BUG=1 in the worker's environment) a bug in the
walk itself for runs whose input says {"walk_bug": true}, once their step `a` has ended."""

import os

from runs.steps.tools import tool
from runs.walk.scheduler import Graph


@tool("test_worker_not_json")
def not_json_tool(args, ctx):
    return {"seen": {1, 2}}  # a set: what a careless tool hands back


if os.environ.get("PAL_TEST_WALK_BUG") == "1":
    _ready = Graph.ready

    def _buggy_ready(self):
        if (self.walk.run.input or {}).get("walk_bug") and "a" in self.walk.step_context:
            raise KeyError("a bug in the walk")
        return _ready(self)

    Graph.ready = _buggy_ready  # type: ignore[method-assign]

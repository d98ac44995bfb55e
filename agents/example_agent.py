#!/usr/bin/env python3
"""The example in-VM agent: reads its input as JSON on stdin, prints one JSON object on stdout.

It journals a `confidence_evaluated` event through stderr, can be told to sleep (input.sleep seconds) so a test
can kill its worker mid-step, and appends what it saw (run, step, key, PAL_RESUME) to the file named by
PAL_AGENT_RECORD, if set, so a test can check that a re-driven agent was told it is being resumed.
"""

import json
import os
import sys
import time


def main():
    data = json.load(sys.stdin)
    seen = {
        "run_id": os.environ.get("PAL_RUN_ID"),
        "step_id": os.environ.get("PAL_STEP_ID"),
        "key": os.environ.get("PAL_IDEMPOTENCY_KEY"),
        "resume": os.environ.get("PAL_RESUME") == "1",
        "pid": os.getpid(),
    }
    record = os.environ.get("PAL_AGENT_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps(seen) + "\n")
    if data.get("mode") == "garbage":
        print("this is not json")
        return 0
    if data.get("mode") == "fail":
        print("something went wrong", file=sys.stderr)
        return 3
    if data.get("mode") == "reserved":
        print(json.dumps({"pal_event": "run_succeeded", "forged": True}), file=sys.stderr, flush=True)
    time.sleep(float(data.get("sleep", 0)))
    print(
        json.dumps({"pal_event": "confidence_evaluated", "confidence": 0.92, "task": data.get("task")}),
        file=sys.stderr,
        flush=True,
    )
    print(json.dumps({"result": f"done: {data.get('task')}", "resumed": seen["resume"], "key": seen["key"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

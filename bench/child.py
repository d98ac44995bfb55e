"""`python -m bench.child SPEC_JSON`: run one measurement function and print its figures.

SPEC_JSON: {"module": "bench.peers_dbos", "func": "per_step_overhead", "kwargs": {...}, "calls": 1}.
The function is called `calls` times; each call returns a number or a list of numbers, all
gathered. The last line printed is `BENCH_RESULT {"status": "ok"|"not_implemented"|"error", ...}`.

The harness starts this in its own process group and kills the group past its time limit;
SIGTERM here becomes SystemExit so `finally` blocks stop the workers first.
"""

import importlib
import json
import math
import signal
import sys
import traceback


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def run(spec: dict) -> dict:
    try:
        fn = getattr(importlib.import_module(spec["module"]), spec["func"])
        values = []
        for _ in range(int(spec.get("calls", 1))):
            out = fn(**spec.get("kwargs", {}))
            values.extend(out if isinstance(out, (list, tuple)) else [out])
    except NotImplementedError as exc:
        return {"status": "not_implemented", "message": str(exc)}
    except Exception as exc:
        return {"status": "error", "message": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:]}
    bad = [v for v in values if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0]
    if not values or bad:
        return {"status": "error", "message": f"expected positive finite numbers, got {values!r}"}
    return {"status": "ok", "values": [float(v) for v in values]}


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    result = run(json.loads(sys.argv[1]))
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

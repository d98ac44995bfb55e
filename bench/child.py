"""`python -m bench.child SPEC_JSON`: run one measurement function and print its figures.

SPEC_JSON: {"module": "bench.peers_dbos", "func": "per_step_overhead", "kwargs": {...}, "calls": 1}.
The function is called `calls` times; each call returns a number, a list of numbers, or a dict
{"values": [numbers], "details": {...}} for a scenario with more than one figure (E, F), all
gathered ("details": one per call). The last line printed is
`BENCH_RESULT {"status": "ok"|"not_implemented"|"skipped"|"error", ...}`.

The harness starts this in its own process group and kills the group past its time limit;
SIGTERM here becomes SystemExit so `finally` blocks stop the workers first.
"""

import importlib
import json
import math
import signal
import sys
import traceback

from bench.common import Skipped


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def run(spec: dict) -> dict:
    try:
        fn = getattr(importlib.import_module(spec["module"]), spec["func"])
        values, details = [], []
        for _ in range(int(spec.get("calls", 1))):
            out = fn(**spec.get("kwargs", {}))
            if isinstance(out, dict):
                details.append(out.get("details", {}))
                out = out["values"]
            values.extend(out if isinstance(out, (list, tuple)) else [out])
    except NotImplementedError as exc:
        return {"status": "not_implemented", "message": str(exc)}
    except Skipped as exc:
        return {"status": "skipped", "message": str(exc)}
    except Exception as exc:
        return {
            "status": "error",
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:],
        }
    bad = [v for v in values if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0]
    if not values or bad:
        return {"status": "error", "message": f"expected positive finite numbers, got {values!r}"}
    result = {"status": "ok", "values": [float(v) for v in values]}
    if details:
        result["details"] = details
    return result


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    result = run(json.loads(sys.argv[1]))
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

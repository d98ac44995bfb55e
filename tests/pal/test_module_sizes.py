"""No module of production code runs over 600 lines (migrations aside): a module that grows past it is split along
its seams, so a newcomer finds one mechanism a module."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 600


def test_no_production_module_runs_over_600_lines():
    over = {}
    for package in ("runs", "journal", "tokens", "pal", "agents"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            lines = len(path.read_text().splitlines())
            if lines > LIMIT:
                over[str(path.relative_to(ROOT))] = lines
    assert over == {}


# The only imports of our own code inside a function: each waits for Django's set-up, none dodges a circle.
LATE_IMPORTS = {
    ("pal/web.py", "runs"): "pal.asgi imports pal.web before django.setup()",
    ("pal/beat.py", "runs.recovery"): "the beat's schedule is read before the engine's models can load",
    ("runs/apps.py", "."): "AppConfig.ready(), Django's hook for imports that reach the models",
    ("runs/apps.py", ".metrics"): "AppConfig.ready()",
    ("runs/apps.py", ".search"): "AppConfig.ready()",
}


def test_no_import_of_our_own_code_hides_inside_a_function():
    """Issue 25: imports run one way at the top of a module; an import inside a function is one that dodges a
    circle, unless it waits for Django's set-up and says so here."""
    ours = {"runs", "journal", "tokens", "pal", "agents", "workflows"}
    late = set()
    for package in sorted(ours):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for fn in ast.walk(ast.parse(path.read_text())):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom):
                        names = [node.module or "."] if node.level == 0 else ["." * node.level + (node.module or "")]
                    elif isinstance(node, ast.Import):
                        names = [alias.name for alias in node.names]
                    else:
                        continue
                    for name in names:
                        if name.startswith(".") or name.split(".")[0] in ours:
                            late.add((str(path.relative_to(ROOT)), name))
    assert late == set(LATE_IMPORTS)

"""Production docstrings state a contract in at most five lines and cite only files the repository has.

History and measurements go to commit bodies or docs/PERFORMANCE-code.md; the why goes in comments."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("runs", "journal", "tokens", "pal")
MAX_LINES = 5


def production_files():
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if "migrations" not in path.parts:
                yield name, path


def docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc is not None:
                yield getattr(node, "lineno", 1), getattr(node, "name", "the module"), doc


def test_no_docstring_runs_over_five_lines():
    long = [
        f"{name}:{line} {owner} ({len(doc.splitlines())} lines)"
        for name, path in production_files()
        for line, owner, doc in docstrings(path)
        if len(doc.splitlines()) > MAX_LINES
    ]
    assert long == [], "docstrings over five lines (keep the contract; the why goes in a comment):\n" + "\n".join(long)


def test_no_production_code_cites_the_contract_file():
    # CONTRACT.md is not in the repository: the reference pages under docs/reference/ are what a reader can open.
    cites = [
        f"{name}:{number}"
        for name, path in production_files()
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "CONTRACT.md" in text or "CONTRACT section" in text
    ]
    assert cites == [], "cite docs/reference/... instead of CONTRACT:\n" + "\n".join(cites)

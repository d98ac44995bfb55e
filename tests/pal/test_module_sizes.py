"""No module of production code runs over 600 lines (migrations aside): a module that grows past it is split along
its seams, so a newcomer finds one mechanism a module."""

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

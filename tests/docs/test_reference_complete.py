"""The reference names everything the code has: every reserved journal kind, every error code the services and
step kinds raise, every setting pal/settings.py reads, every management command, every kind a run waits on."""

import re
from pathlib import Path

from journal.models import RESERVED_KINDS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
CODE = [p for package in ("runs", "journal", "tokens", "pal") for p in (ROOT / package).rglob("*.py")]
CODE = [p for p in CODE if "migrations" not in p.parts]


def named(text: str, names) -> list[str]:
    """The names the text does not mention as `name`."""
    return sorted(name for name in names if f"`{name}`" not in text)


def test_every_reserved_journal_kind_is_in_journal_md():
    assert len(RESERVED_KINDS) >= 30
    assert named((REFERENCE / "journal.md").read_text(), RESERVED_KINDS) == []


def test_every_error_code_of_the_code_is_in_the_reference():
    codes = {code for path in CODE for code in re.findall(r'\bcode="([a-z_]+)"', path.read_text())}
    assert len(codes) > 50
    everything = "\n".join(p.read_text() for p in REFERENCE.glob("*.md"))
    assert named(everything, codes) == []


def test_every_setting_read_from_the_environment_is_in_settings_md():
    settings = (ROOT / "pal" / "settings.py").read_text()
    names = set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"', settings))
    assert len(names) > 40
    assert named((REFERENCE / "settings.md").read_text(), names) == []


def test_every_management_command_is_in_the_docs():
    commands = {p.stem for p in ROOT.glob("*/management/commands/*.py") if not p.stem.startswith("_")}
    assert "pal_sweep" in commands
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *REFERENCE.glob("*.md")])
    assert sorted(c for c in commands if c not in docs) == []


def test_every_kind_a_run_waits_on_is_in_journal_md():
    kinds = {
        kind
        for path in CODE
        for kind in re.findall(r'"kind": "([a-z_]+)"', path.read_text())
        if kind in {"approval", "signal", "timer", "child", "rate_limit", "budget", "concurrency"}
    }
    assert {"rate_limit", "budget", "timer"} <= kinds
    run_waiting = next(line for line in (REFERENCE / "journal.md").read_text().splitlines() if "`run_waiting`" in line)
    assert named(run_waiting, kinds - {"concurrency"}) == []  # a run queued on its group waits queued, not waiting

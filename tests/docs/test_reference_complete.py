"""The reference names everything the code has: every reserved journal kind, every error code the services and
step kinds raise, every setting pal/settings.py reads, every management command, every kind a run waits on, every
page address, every admin action and every metric."""

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
        if kind
        in {
            "approval",
            "signal",
            "timer",
            "child",
            "rate_limit",
            "budget",
            "concurrency",
            "nondeterminism",
            "code_missing",
            "paused",
        }
    }
    assert {"rate_limit", "budget", "timer"} <= kinds
    run_waiting = next(line for line in (REFERENCE / "journal.md").read_text().splitlines() if "`run_waiting`" in line)
    assert named(run_waiting, kinds - {"concurrency"}) == []  # a run queued on its group waits queued, not waiting


def test_every_error_code_of_a_default_or_a_body_is_in_the_reference_too():
    # ServiceError's own default (`code: str = "invalid"`), a helper's default code, and codes written into a body
    # ({"code": "unhealthy"}) are codes a client sees as much as `code="..."` ones.
    patterns = (r'\bcode: str = "([a-z_]+)"', r'"code":\s*"([a-z_]+)"')
    codes = {code for path in CODE for pattern in patterns for code in re.findall(pattern, path.read_text())}
    assert {"invalid", "unhealthy"} <= codes
    everything = "\n".join(p.read_text() for p in REFERENCE.glob("*.md"))
    assert named(everything, codes) == []


def test_every_page_address_is_in_pages_md():
    from django.urls import URLPattern, URLResolver, get_resolver

    def paths(patterns, prefix=""):
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                if route.startswith(("admin/", "api/v1/")):
                    yield route  # the admin's and the API's own addresses are their pages'
                else:
                    yield from paths(entry.url_patterns, route)
            elif isinstance(entry, URLPattern):
                yield route

    addresses = {"/" + re.sub(r"<\w+:(\w+)>", r"<\1>", route) for route in paths(get_resolver().url_patterns)}
    assert {"/runs/<run_id>/", "/decisions/<token>/", "/metrics", "/admin/"} <= addresses
    assert named((REFERENCE / "pages.md").read_text(), addresses) == []


def test_every_admin_action_is_in_admin_md():
    from django.contrib import admin

    actions = {
        action.__name__
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in ("runs", "journal", "tokens")
        for action in model_admin.actions or ()
        if callable(action)
    }
    assert {"redrive_runs", "cancel_runs", "revoke_tokens", "abort_reruns"} <= actions
    assert named((REFERENCE / "admin.md").read_text(), actions) == []


def test_every_management_command_is_in_commands_md():
    commands = {p.stem for p in ROOT.glob("*/management/commands/*.py") if not p.stem.startswith("_")}
    text = (REFERENCE / "commands.md").read_text()
    assert sorted(c for c in commands if f"`{c}" not in text) == []


def test_every_metric_is_in_metrics_md():
    sources = (ROOT / "runs" / "metrics.py").read_text() + (ROOT / "pal" / "meters.py").read_text()
    metrics = set(re.findall(r'"(pal_[a-z_]+)"', sources))
    counters = {m for m in metrics if re.search(rf'Counter(MetricFamily)?\(\s*"{m}"', sources)}
    exposed = {f"{m}_total" if m in counters else m for m in metrics}
    assert {"pal_stuck_runs", "pal_fenced_out_total", "pal_step_duration_seconds"} <= exposed
    assert named((REFERENCE / "metrics.md").read_text(), exposed) == []

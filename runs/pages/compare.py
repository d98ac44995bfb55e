"""The compare page (/runs/compare/?a=ID&b=ID): two runs step by step as runs.compare shapes them, drawn for an
operator: each step's status, time, tokens and cost side by side, whether the outputs are the same, and where they
differ (a model's answer word by word). Without both ids it is a form asking for them; a bad id answers 400 and an
unknown run 404, each naming it.
"""

import uuid
from typing import Any

from django.shortcuts import render
from django.views.decorators.http import require_GET

from .. import compare
from ..errors import NotFound
from .access import reader
from .formatting import compact_json, duration_text, pretty_json, usd

PREVIEW = 4096  # characters of a changed value shown in the diff


def _cut(text: str) -> str:
    return text if len(text) <= PREVIEW else text[:PREVIEW] + "…"


def _change(entry: dict) -> dict:
    """One path of a diff as the page draws it: a text change word by word, any other change as both values."""
    a, b = entry["a"], entry["b"]
    segments = compare.text_diff(a, b) if isinstance(a, str) and isinstance(b, str) else None
    return {
        "path": entry["path"] or "(the whole output)",
        "change": entry["change"],
        "segments": segments,
        "a": _cut(a if isinstance(a, str) else pretty_json(a)) if entry["change"] != "added" else "",
        "b": _cut(b if isinstance(b, str) else pretty_json(b)) if entry["change"] != "removed" else "",
    }


def _cell(side: dict | None) -> dict | None:
    if side is None:
        return None
    return {
        **side,
        "status_text": side["status"].replace("_", " "),
        "item_count": side.get("items"),  # not "items": a template would find the dict's method
        "took": duration_text(side["ms"] / 1000) if side["ms"] is not None else "",
        "cost": usd(side["cost_usd"]) if side["cost_usd"] else "",
        "preview": compact_json(side["output"], 90) if side["has_output"] else "",
    }


def _rows(result: dict) -> list[dict]:
    return [
        {
            **step,
            "a": _cell(step["a"]),
            "b": _cell(step["b"]),
            "changes": [_change(entry) for entry in step["diff"]],
        }
        for step in result["steps"]
    ]


def _totals(totals: dict) -> dict:
    return {
        **totals,
        "took": duration_text(totals["ms"] / 1000) if totals["ms"] is not None else "",
        "cost": usd(totals["cost_usd"]),
    }


@require_GET
@reader
def run_compare(request):
    ids = {side: (request.GET.get(side) or "").strip() for side in ("a", "b")}
    context: dict[str, Any] = {"ids": ids, "problems": [], "result": None}
    status = 200
    parsed = {}
    for side, text in ids.items():
        if not text:
            continue
        try:
            parsed[side] = uuid.UUID(text)
        except ValueError:
            context["problems"].append(f"{side}: {text!r} is not a run id")
            status = 400
    if status == 200 and len(parsed) == 2:
        try:
            result = compare.run_compare(a=parsed["a"], b=parsed["b"])
        except NotFound as exc:
            context["problems"].append(exc.detail)
            status = 404
        else:
            context["result"] = result
            context["rows"] = _rows(result)
            context["totals"] = {side: _totals(result["totals"][side]) for side in ("a", "b")}
            context["differing"] = sum(1 for row in result["steps"] if row["same_output"] is False)
    return render(request, "runs/compare.html", context, status=status)

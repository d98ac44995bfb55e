"""The run page's step panel (/runs/<id>/steps/<step_id>/): one step's attempts and items as runs.step_detail
reads them, drawn for an operator. A click on a waterfall bar or a journal row fetches it with htmx
(static/step-panel.js); without JavaScript the same address is a page of its own. A model call reads as a
conversation (an agent loop turn by turn, each tool call with its arguments and result); a big value shows its
first PREVIEW characters and a "load all" link (?full=input|output|error&attempt=N on the attempt's step id)."""

from typing import Any
from urllib.parse import urlencode

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import escape
from django.views.decorators.http import require_GET

from .. import services
from ..errors import NotFound
from ..step_detail import step_detail
from .access import reader
from .formatting import clock, duration_text, pretty_json, usd

PREVIEW = 4096  # characters of a value shown before "load all"
ENTRIES_IN_VIEW = 20  # a for_each step's attempts drawn in full; past that, those that did not complete
FULL_FIELDS = ("input", "output", "error")


def step_url(run_id, step_id: str) -> str:
    return reverse("runs:step", args=[run_id, step_id])


def shown(value: Any, *, full_url: str) -> dict:
    """A JSON value as the panel shows it: its text up to PREVIEW characters, and how to get the rest."""
    text = value if isinstance(value, str) else pretty_json(value)
    cut = len(text) > PREVIEW
    return {
        "text": text[:PREVIEW] + ("…" if cut else ""),
        "cut": cut,
        "size": size_text(len(text.encode("utf-8", "surrogatepass"))),
        "full_url": full_url,
    }


def size_text(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.1f} KB" if size < 1024 * 1024 else f"{size / 1024 / 1024:.1f} MB"


def conversation(entry: dict, *, full_url) -> dict | None:
    """A model call's messages (or its prompt as the one user message) and its answer; None when there is
    neither (an input not journaled and no answer yet)."""
    given = entry["input"] if isinstance(entry["input"], dict) else {}
    messages = given.get("messages")
    if not isinstance(messages, list):
        messages = [{"role": "user", "content": given["prompt"]}] if "prompt" in given else []
    output = entry["output"] if isinstance(entry["output"], dict) else {}
    answer = None if entry.get("turns") else output.get("text")  # a loop's answer is its last turn
    if not messages and not isinstance(answer, str) and not entry.get("turns"):
        return None
    said = []
    for message in messages:
        message = message if isinstance(message, dict) else {"content": message}
        content = message.get("content")
        text = content if isinstance(content, str) else pretty_json(content)
        said.append({"role": str(message.get("role") or "user"), "content": shown(text, full_url=full_url("input"))})
    return {
        "model": given.get("model") or entry["model"],
        "messages": said,
        "answer": shown(answer, full_url=full_url("output")) if isinstance(answer, str) else None,
    }


def turns_view(run, entry: dict, *, full_url) -> list[dict]:
    """An agent loop turn by turn: the model's message with its tokens and cost, then each tool call it asked for
    with its arguments (and the model's, when an operator edited them), its status and its result or error."""
    view = []
    for turn in entry.get("turns") or []:
        message = turn.get("message") if isinstance(turn.get("message"), dict) else {}
        content = message.get("content")
        calls = []
        for call in turn["tool_calls"]:
            item_url = step_url(run.id, call["step_id"])
            calls.append(
                {
                    **call,
                    "url": item_url,
                    "arguments_shown": shown(call["arguments"], full_url=item_url),
                    "asked_shown": shown(call["asked"], full_url=item_url) if call.get("asked") is not None else None,
                    "result_shown": shown(call["result"], full_url=item_url) if call["status"] == "completed" else None,
                    "error_shown": shown(call["error"], full_url=item_url) if call.get("error") else None,
                }
            )
        view.append(
            {
                **turn,
                "content": shown(content, full_url=full_url("output"))
                if isinstance(content, str) and content
                else None,
                "tokens": turn["prompt_tokens"] + turn["completion_tokens"],
                "cost": usd(turn["cost_usd"]),
                "calls": calls,
                "last": not calls,
            }
        )
    return view


def entry_view(run, entry: dict, *, kind: str) -> dict:
    """One attempt as the panel's template reads it."""

    def full_url(field: str) -> str:
        query = urlencode({"full": field, "attempt": entry["attempt"] or ""})
        return f"{step_url(run.id, entry['step_id'])}?{query}"

    where = f"item {entry['item']} · " if entry["item"] is not None else ""
    label = "skipped" if entry["status"] == "skipped" else f"{where}attempt {entry['attempt']}"
    return {
        **entry,
        "label": label,
        "anchor": f"{entry['step_id']}-{entry['attempt'] or 0}",
        "started": clock(entry["started_at"]),
        "ended": clock(entry["ended_at"]) if entry["ended_at"] else "",
        "took": duration_text(entry["ms"] / 1000) if entry["ms"] is not None else "",
        "cost": usd(entry["cost_usd"]),
        "conversation": conversation(entry, full_url=full_url) if kind == "llm_call" else None,
        "turns_view": turns_view(run, entry, full_url=full_url) if kind == "llm_call" else [],
        "input_shown": shown(entry["input"], full_url=full_url("input")) if entry["input"] is not None else None,
        "output_shown": shown(entry["output"], full_url=full_url("output")) if entry["status"] == "completed" else None,
        "error_shown": shown(entry["error"], full_url=full_url("error")) if entry["error"] else None,
        "item_url": step_url(run.id, entry["step_id"]) if entry["item"] is not None else "",
        "child_url": reverse("runs:detail", args=[entry["child_run_id"]]) if entry["child_run_id"] else "",
    }


def panel_context(run, detail: dict) -> dict:
    """The panel: the step's header and its attempts; a for_each step of many items draws the first
    ENTRIES_IN_VIEW and every one that did not complete, and lists the rest as links."""
    entries = detail["attempts"]
    in_view, folded = entries, []
    if len(entries) > ENTRIES_IN_VIEW:
        in_view = [e for n, e in enumerate(entries) if n < ENTRIES_IN_VIEW or e["status"] != "completed"]
        folded = [e for n, e in enumerate(entries) if n >= ENTRIES_IN_VIEW and e["status"] == "completed"]
    spent = {
        "tokens": sum(e["tokens"] for e in entries),
        "cost": usd(sum(e["cost_usd"] for e in entries)),
    }
    return {
        "run": run,
        "detail": detail,
        "step_id": detail["step_id"],
        "entries": [entry_view(run, e, kind=detail["kind"]) for e in in_view],
        "folded": [{**e, "url": step_url(run.id, e["step_id"])} for e in folded],
        "spent": spent,
        "self_url": step_url(run.id, detail["step_id"]),
        "deep_link": f"{reverse('runs:detail', args=[run.id])}#step-{detail['step_id']}",
        "preview": PREVIEW,
    }


def full_value(request, run, detail: dict) -> HttpResponse:
    """The whole of one attempt's input, output or error: a fragment for htmx's "load all", else plain JSON."""
    field, attempt = request.GET.get("full", ""), request.GET.get("attempt", "")
    if field not in FULL_FIELDS:
        raise Http404(f"full must be one of {', '.join(FULL_FIELDS)}, not {field!r}")
    entry = next((e for e in detail["attempts"] if str(e["attempt"] or "") == attempt), None)
    if entry is None or entry["step_id"] != detail["step_id"]:
        raise Http404(f"step {detail['step_id']} of run {run.id} has no attempt {attempt!r}")
    value = entry[field]
    text = value if isinstance(value, str) else pretty_json(value)
    if request.htmx:
        return HttpResponse(f'<div class="sp-value"><pre class="json sp-full">{escape(text)}</pre></div>')
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


@require_GET
@reader
def step_panel(request, run_id, step_id: str):
    try:
        run = services.run_get(run_id=run_id)
    except NotFound as exc:
        raise Http404(exc.detail) from None
    template = "runs/step.html#step_panel" if request.htmx else "runs/step.html"
    try:
        detail = step_detail(run=run, step_id=step_id)
    except NotFound as exc:  # the panel says so in place (htmx swaps a 404's answer)
        return render(request, template, {"run": run, "step_id": step_id, "problem": exc.detail}, status=404)
    if "full" in request.GET:
        return full_value(request, run, detail)
    return render(request, template, panel_context(run, detail))

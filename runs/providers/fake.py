"""The built-in deterministic provider: same messages, same answer; works offline.

Offered tools, it asks for the ones the first user message names on lines `call NAME {json arguments}`, once;
given their results (role: tool), it answers with text that quotes them, as a model that is done would."""

import hashlib
import json
import re

from .base import Completion, Provider

CALL_LINE = re.compile(r"^\s*call\s+([A-Za-z0-9_.-]+)\s*(\{.*\})?\s*$", re.MULTILINE)


class FakeProvider(Provider):
    name = "fake"

    def complete(self, *, model, messages, key, options, timeout, before_try=lambda: None, pause=None):
        before_try()
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:12]
        calls = _calls_asked(messages, options)
        if calls:
            text = ""
        elif any(m.get("role") == "tool" for m in messages):
            results = [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]
            text = f"[fake {model} {digest}] done: " + "; ".join(r[:100] for r in results)
        else:
            last = str(messages[-1].get("content", "")) if messages else ""
            text = f"[fake {model} {digest}] {last[:200]}"
        return Completion(
            text=text,
            model=model,
            prompt_tokens=max(1, len(prompt.split())),
            completion_tokens=max(1, len(text.split()) + len(calls)),
            tool_calls=calls,
        )


def _calls_asked(messages: list[dict], options: dict) -> list[dict]:
    """The tool calls of the first turn: the `call NAME {...}` lines of the first user message, offered tools only."""
    offered = {t.get("function", {}).get("name") for t in options.get("tools") or []}
    if not offered or any(m.get("role") in ("assistant", "tool") for m in messages):
        return []
    first = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
    calls = []
    for n, (name, arguments) in enumerate(CALL_LINE.findall(first)):
        if name in offered:
            try:
                parsed = json.loads(arguments) if arguments else {}
            except ValueError:
                parsed = arguments  # as a model's broken arguments come: the loop says so
            calls.append({"id": f"call_{n}", "name": name, "arguments": parsed})
    return calls

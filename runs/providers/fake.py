"""The built-in deterministic provider: same messages, same answer; works offline."""

import hashlib

from .base import Completion, Provider


class FakeProvider(Provider):
    name = "fake"

    def complete(self, *, model, messages, key, options, timeout, before_try=lambda: None, pause=None):
        before_try()
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:12]
        last = str(messages[-1].get("content", "")) if messages else ""
        text = f"[fake {model} {digest}] {last[:200]}"
        return Completion(
            text=text,
            model=model,
            prompt_tokens=max(1, len(prompt.split())),
            completion_tokens=max(1, len(text.split())),
        )

"""An OpenAI-compatible provider over httpx (docs/reference/workflows.md, llm_call)."""

import json
import time

import httpx
from django.conf import settings

from ..errors import StepError
from ..transport import Unanswered, send_with_tries
from .base import Completion, Provider


class OpenAIProvider(Provider):
    name = "openai"

    def __init__(self, base_url: str | None = None, api_key: str | None = None):
        self.base_url = (base_url or settings.PAL_LLM_BASE_URL).rstrip("/")
        self.api_key = settings.PAL_LLM_API_KEY if api_key is None else api_key

    def complete(self, *, model, messages, key, options, timeout, before_try=lambda: None, pause=time.sleep):
        if not self.base_url:
            raise StepError("provider 'openai' needs PAL_LLM_BASE_URL", code="provider_not_configured")
        body = {"model": model, "messages": messages, **options}
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        try:
            response = send_with_tries(
                lambda: httpx.post(url, json=body, headers=headers, timeout=timeout or settings.PAL_LLM_TIMEOUT),
                before_try=before_try,
                pause=pause,
            )
        except Unanswered as exc:
            # Unknown outcome: the provider may have billed it; the same key lets it dedup the repeat.
            raise StepError(
                f"provider did not answer after {exc.tries} tries with key {key}: {exc.problem}",
                permanent=False,
                code="provider_unavailable",
            ) from None
        if response.status_code >= 300:
            raise StepError(
                f"provider refused the call: HTTP {response.status_code}: {_excerpt(response.text)}",
                code="provider_refused",
                details={"status": response.status_code},
            )
        return self._parse(response, model)

    def _parse(self, response, model):
        try:
            data = response.json()
            message = data["choices"][0]["message"]
            text = message["content"]
            usage = data.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", 0))
            completion_tokens = int(usage.get("completion_tokens", 0))
            tool_calls = [_tool_call(call) for call in message.get("tool_calls") or []]
            if text is None and tool_calls:
                text = ""  # a turn of tool calls only
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise StepError(
                f"provider answered something that is not a chat completion ({type(exc).__name__}: {exc}): "
                f"{_excerpt(response.text)}",
                code="provider_garbage",
            ) from None
        return Completion(
            text=text,
            model=data.get("model") or model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            tool_calls=tool_calls,
        )


def _tool_call(call: dict) -> dict:
    """One of OpenAI's tool_calls as {id, name, arguments}: arguments parsed from their JSON text when they are an
    object, else the text as it came (the loop answers the model that they are not)."""
    function = call["function"]
    name, text = function["name"], function.get("arguments") or "{}"
    if not isinstance(call.get("id"), str) or not isinstance(name, str) or not isinstance(text, str):
        raise TypeError("a tool call without id, function.name or function.arguments as text")
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = text
    return {"id": call["id"], "name": name, "arguments": arguments if isinstance(arguments, dict) else text}


def _excerpt(text: str, limit: int = 200) -> str:
    text = (text or "").strip().replace("\n", " ")
    return text[:limit] + ("…" if len(text) > limit else "")

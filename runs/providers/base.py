"""The contract of an LLM provider."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from ..errors import StepError


@dataclass
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    # The tool calls the model asked for (an llm_call with tools): [{id, name, arguments}], arguments as the model
    # gave them (a JSON object, or the text it sent when that was no JSON object).
    tool_calls: list[dict] = field(default_factory=list)


class Provider:
    """complete(model, messages, key, options) returns a Completion or raises StepError.

    key is the step attempt's (or a model turn's) idempotency key, sent so that a retry or a replay dedups there;
    options may hold OpenAI's `tools`. Unknown outcomes (timeouts, 5xx, 408/429) are retried inside the call with
    the same key; a definite refusal raises StepError(permanent=True).
    """

    name = ""

    def complete(
        self,
        *,
        model: str,
        messages: list[dict],
        key: str,
        options: dict,
        timeout: float | None,
        before_try: Callable[[], None] = lambda: None,  # called before each try (rate limits count every one)
        pause: Callable[[float], None] = time.sleep,  # sleeps between tries (StepContext.pause: stops on a cancel)
    ) -> Completion:
        raise NotImplementedError


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float:
    prices = settings.PAL_LLM_PRICES.get(model)
    if not prices:
        return 0.0
    prompt_price, completion_price = prices
    return round((prompt_tokens * prompt_price + completion_tokens * completion_price) / 1000, 8)


__all__ = ["Completion", "Provider", "StepError", "cost_usd"]

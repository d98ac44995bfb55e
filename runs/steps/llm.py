"""llm_call: one chat completion, sent with the attempt's key as Idempotency-Key; with `tools`, the agent loop
(runs.steps.llm_loop): a model turn after another, each with its own key, until the model needs no tool."""

from django.conf import settings

from ..errors import StepError
from ..providers.base import Completion, cost_usd
from ..providers.fake import FakeProvider
from ..providers.openai import OpenAIProvider
from ..secrets import mask
from .base import StepKind, register
from .llm_loop import DEFAULT_MAX_TURNS, run_loop
from .tools import TOOLS

PROVIDERS = {"fake": FakeProvider, "openai": OpenAIProvider}


def default_provider() -> str:
    return "openai" if settings.PAL_LLM_BASE_URL else "fake"


@register
class LLMCall(StepKind):
    kind = "llm_call"
    required = ("model",)
    optional = ("prompt", "messages", "provider", "max_tokens", "temperature", "tools", "max_turns", "approve_tools")
    templated = ("prompt", "messages")

    def validate(self, step):
        errors = []
        if not isinstance(step.get("model"), str) or not step.get("model"):
            errors.append(("model", "must be a model name"))
        has_prompt, has_messages = "prompt" in step, "messages" in step
        if has_prompt == has_messages:
            errors.append(("prompt", "give exactly one of prompt or messages"))
        if has_prompt and not isinstance(step["prompt"], str):
            errors.append(("prompt", "must be a string"))
        if has_messages:
            messages = step["messages"]
            if not isinstance(messages, list) or not messages:
                errors.append(("messages", "must be a non-empty list of {role, content}"))
            else:
                for i, message in enumerate(messages):
                    if not isinstance(message, dict) or set(message) != {"role", "content"}:
                        errors.append((f"messages[{i}]", "must be an object with exactly role and content"))
                    elif message["role"] not in ("system", "user", "assistant") or not isinstance(
                        message["content"], str
                    ):
                        errors.append((f"messages[{i}]", "role must be system, user or assistant and content a string"))
        if "provider" in step and step["provider"] not in PROVIDERS:
            errors.append(("provider", f"must be one of {', '.join(sorted(PROVIDERS))}"))
        if "max_tokens" in step and (
            not isinstance(step["max_tokens"], int) or isinstance(step["max_tokens"], bool) or step["max_tokens"] < 1
        ):
            errors.append(("max_tokens", "must be a positive whole number"))
        if "temperature" in step and (
            not isinstance(step["temperature"], (int, float))
            or isinstance(step["temperature"], bool)
            or not 0 <= step["temperature"] <= 2
        ):
            errors.append(("temperature", "must be a number from 0 to 2"))
        return errors + _tool_problems(step)

    def run(self, step, ctx):
        provider = PROVIDERS[step.get("provider") or default_provider()]()
        if "messages" in step:
            messages = step["messages"]
        else:
            prompt = step["prompt"]
            messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]
        options = {k: step[k] for k in ("max_tokens", "temperature") if k in step}
        ctx.check_lease()

        def complete(messages: list[dict], key: str, more: dict) -> Completion:
            """One model call: its rate limits' slots taken at every try, its tokens reported to them."""
            slots: list = []

            def before_try() -> None:
                ctx.lease_held()  # every try: a cancelled or stolen run calls the provider no more
                slots.extend(ctx.rate_limit("llm", step["model"]))

            completion = provider.complete(
                model=step["model"],
                messages=messages,
                key=key,
                options={**options, **more},
                timeout=ctx.timeout,
                before_try=before_try,
                pause=ctx.pause,
            )
            ctx.rate_report(slots, completion.prompt_tokens + completion.completion_tokens)
            if not isinstance(completion.text, str):
                raise StepError("provider returned no text", code="provider_garbage")
            return completion

        if step.get("tools"):
            return run_loop(step, ctx, messages, complete)
        completion = complete(messages, ctx.key, {})
        # A model may echo a secret it was shown: what it answered is kept with every configured secret masked.
        return mask(
            {
                "text": completion.text,
                "model": completion.model,
                "usage": {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens},
                "cost_usd": cost_usd(step["model"], completion.prompt_tokens, completion.completion_tokens),
            }
        )


def _tool_problems(step: dict) -> list[tuple[str, str]]:
    """tools: registered names; max_turns: 1 to 100; approve_tools: names among tools."""
    errors = []
    tools = step.get("tools")
    if "tools" in step:
        if not isinstance(tools, list) or not tools or not all(isinstance(name, str) for name in tools):
            errors.append(("tools", "must be a non-empty list of registered tool names"))
            tools = []
        for i, name in enumerate(tools):
            if name not in TOOLS:
                errors.append((f"tools[{i}]", f"unknown tool {name!r}; registered: {', '.join(sorted(TOOLS))}"))
    max_turns = step.get("max_turns", DEFAULT_MAX_TURNS)
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= 100:
        errors.append(("max_turns", "must be a whole number from 1 to 100"))
    elif "max_turns" in step and not tools:
        errors.append(("max_turns", "is for an llm_call with tools"))
    approve = step.get("approve_tools")
    if "approve_tools" in step:
        if not isinstance(approve, list) or not all(isinstance(name, str) for name in approve):
            errors.append(("approve_tools", "must be a list of tool names"))
        else:
            for i, name in enumerate(approve):
                if name not in (tools or []):
                    errors.append((f"approve_tools[{i}]", f"{name!r} is not among this step's tools"))
    return errors

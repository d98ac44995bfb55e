"""One way to send a request to a peer and try again: the model provider's call and the webhook share it."""

# send_with_tries calls send() up to PAL_TRANSPORT_RETRIES + 1 times, before_try() before each (a lease check, a
# rate-limit slot, a deadline); a transport error or a retryable answer (408, 429, 5xx) goes again after a backoff
# (or the answer's Retry-After, at most 30 s), through pause() so a cancel stops the wait. Any other answer comes
# back as it is; when every try failed, Unanswered says what the last one met.

import time
from collections.abc import Callable

import httpx
from django.conf import settings

RETRYABLE = frozenset({408, 429})  # and every 5xx: the peer may or may not have acted; the same key goes again
MAX_RETRY_AFTER = 30.0


class Unanswered(Exception):
    """Every try met a transport error or a retryable answer: the outcome is unknown."""

    def __init__(self, problem: str, tries: int):
        super().__init__(problem)
        self.problem, self.tries = problem, tries


def retryable(status: int) -> bool:
    return status in RETRYABLE or status >= 500


def send_with_tries(
    send: Callable[[], httpx.Response],
    *,
    before_try: Callable[[], object] = lambda: None,
    pause: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """The first answer that is not retryable; Unanswered when none came (see the module's docstring)."""
    tries = settings.PAL_TRANSPORT_RETRIES + 1
    problem = ""
    for number in range(1, tries + 1):
        before_try()
        try:
            response = send()
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"  # sent or not, we cannot know: the same key goes again
        else:
            if not retryable(response.status_code):
                return response
            problem = f"HTTP {response.status_code}"
            retry_after = response.headers.get("Retry-After", "")
            if retry_after.isdigit() and number < tries:
                pause(min(float(retry_after), MAX_RETRY_AFTER))
                continue
        if number < tries:
            pause(min(0.2 * 2 ** (number - 1), 5))
    raise Unanswered(problem, tries)

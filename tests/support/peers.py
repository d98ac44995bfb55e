"""Local stand-ins for the outside world: an LLM provider, a webhook receiver and an SMTP server.

Each one runs in threads of the test process on 127.0.0.1 with a port the kernel picks, records every
request it gets, and behaves like the real thing where durability depends on it: the provider bills a
repeated ``Idempotency-Key`` once and answers it with the stored reply, the receiver checks
``X-PAL-Signature``. Knobs (``delay``, ``fail_next``, ``garbage_next``, ``request_started``) let a test
kill a worker in the middle of a call or make the peer fail a given number of times.

A request is recorded, billed and answered-to-be the moment it arrives, before ``delay``: a worker killed
while the peer sleeps has still cost one call, exactly as with a real provider.
"""

from __future__ import annotations

import asyncio
import collections
import email
import email.policy
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from aiosmtpd.controller import Controller

HOST = "127.0.0.1"


@dataclass
class RecordedRequest:
    """One HTTP request as a peer received it, and what the peer did with it."""

    method: str
    path: str
    headers: httpx.Headers  # case-insensitive: headers["idempotency-key"] works too
    body: bytes
    received_at: float
    outcome: str = ""  # provider: billed / replayed / failed / garbage / rejected; receiver: delivered / failed
    status: int | None = None  # the status the peer answered (or meant to, if the client had gone)
    signature_valid: bool | None = None  # receiver only; None when it has no secret

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get("Idempotency-Key")

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, peer: _HTTPPeer):
        self.peer = peer
        super().__init__((HOST, 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real server; every answer has a Content-Length
    server: _Server

    def setup(self):
        super().setup()
        self.server.peer._connection_opened(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.peer._connection_closed(self.connection)

    def _dispatch(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers=httpx.Headers(list(self.headers.items())),
            body=body,
            received_at=time.time(),
        )
        self.server.peer._handle(self, request)

    do_POST = do_PUT = do_PATCH = do_GET = do_DELETE = _dispatch

    def log_message(self, format, *args):
        pass  # keep test output clean; every request is in the peer's records


class _HTTPPeer:
    """What the HTTP peers share: the server thread, the knobs and the recorded requests."""

    def __init__(self):
        self.delay = 0.0
        self.echo_on_error = False  # an error answer quotes the request's headers and body, as careless peers do
        self.request_started = threading.Event()
        self.requests: list[RecordedRequest] = []
        self._failures: collections.deque[int] = collections.deque()
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self):
        assert self._server is None, "already started"
        self._stopping.clear()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"{type(self).__name__}:{self.port}",
        )
        self._thread.start()
        return self

    def stop(self):
        if self._server is None:
            return
        self._stopping.set()  # wakes handlers sleeping in `delay`
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:  # keep-alive connections would otherwise outlive the peer
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # --- knobs -------------------------------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500):
        """Answer the next ``n`` requests with HTTP ``status`` (and do nothing else with them)."""
        with self._lock:
            self._failures.extend([status] * n)

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests have arrived; returns them. Raises AssertionError on timeout."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= n, timeout):
                raise AssertionError(f"{type(self).__name__} got {len(self.requests)} requests, expected {n}")
            return list(self.requests)

    # --- plumbing for subclasses -------------------------------------------------------------------

    def _record(self, request: RecordedRequest):
        with self._lock:
            self.requests.append(request)
            self._lock.notify_all()
        self.request_started.set()

    def _sleep_delay(self):
        if self.delay > 0:
            self._stopping.wait(self.delay)

    def _respond(self, handler, request, status, body, content_type="application/json", headers=None):
        request.status = status
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(body)
            handler.wfile.flush()
        except OSError:  # the client gave up (or was killed) while we were answering
            handler.close_connection = True

    def _connection_opened(self, conn):
        with self._lock:
            self._connections.add(conn)

    def _connection_closed(self, conn):
        with self._lock:
            self._connections.discard(conn)

    def _handle(self, handler, request):  # pragma: no cover - overridden
        raise NotImplementedError

    def _error_answer(self, request, body: dict) -> dict:
        """body, with the request quoted back when echo_on_error is set."""
        if not self.echo_on_error:
            return body
        sent = {"authorization": request.headers.get("Authorization"), "body": request.body.decode(errors="replace")}
        return {"you_sent": sent, **body}


def _error_body(status: int) -> dict:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}
    return {
        "error": {
            "message": f"simulated error {status}",
            "type": kinds.get(status, "server_error"),
            "code": str(status),
        }
    }


def _words(text: Any) -> int:
    return len(str(text).split())


def default_reply(body: dict) -> str:
    """The provider's answer unless a test sets ``reply``: it names the last user message."""
    messages = body.get("messages") or []
    last = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    return f"Reply to: {last}"


def agent_reply(
    *, turns: int, calls: int, tool: str, arguments: Callable[[int, int], dict] | None = None, text: str = "done"
) -> Callable[[dict], Any]:
    """A ``reply`` that plays an agent as OpenAI's API does: while the conversation has fewer than ``turns - 1``
    assistant turns, it answers with ``calls`` calls of ``tool`` (``arguments(turn, n)``, default ``{"turn", "n"}``);
    then with ``text`` and the tool results it was given. Decided from the body alone, so a replay agrees."""

    def reply(body: dict) -> Any:
        messages = body.get("messages") or []
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn < turns and body.get("tools"):
            made = arguments or (lambda t, n: {"turn": t, "n": n})
            return {"content": None, "tool_calls": [{"name": tool, "arguments": made(turn, n)} for n in range(calls)]}
        results = [m.get("content") for m in messages if m.get("role") == "tool"]
        return f"{text} after {len(results)} tool results: {' | '.join(str(r) for r in results)}"

    return reply


class LLMProvider(_HTTPPeer):
    """An OpenAI-compatible ``POST /v1/chat/completions`` that dedups on ``Idempotency-Key``.

    ``calls``: every request (billed, replayed or failed). ``billed``: Idempotency-Key -> number of billed
    calls; a key seen before is answered with the stored reply and not billed again (requests without a
    key are billed under ``None``). ``reply``: a string, or a function of the request body returning one, or
    returning a message ``{"content", "tool_calls": [{"name", "arguments"}]}`` to answer with tool calls (OpenAI's
    form: ids ``call_<n>``, arguments as JSON text; see ``agent_reply``). ``tools`` and ``role: tool`` messages are
    taken as OpenAI takes them.
    ``api_key``: when set, a request without ``Authorization: Bearer <api_key>`` gets 401. ``retry_after``: the
    seconds a 429 or 503 of ``fail_next`` asks the client to wait.
    """

    def __init__(self, *, api_key: str | None = None, reply: str | Callable[[dict], str] = default_reply):
        super().__init__()
        self.api_key = api_key
        self.reply = reply
        self.billed: dict[str | None, int] = {}
        self._answers: dict[str, dict] = {}
        self._garbage = 0
        self.retry_after = "0"  # the Retry-After header of a 429 or 503 that fail_next asked for

    @property
    def calls(self) -> list[RecordedRequest]:
        return self.requests

    @property
    def url(self) -> str:
        """The base URL to use as PAL_LLM_BASE_URL."""
        return f"{self.base_url}/v1"

    @property
    def total_billed(self) -> int:
        with self._lock:
            return sum(self.billed.values())

    def env(self) -> dict[str, str]:
        """Settings that point PAL (a worker's environment) at this provider."""
        return {"PAL_LLM_BASE_URL": self.url, "PAL_LLM_API_KEY": self.api_key or ""}

    def garbage_next(self, n: int = 1):
        """Answer the next ``n`` requests with 200 and a body that is not JSON (not billed)."""
        with self._lock:
            self._garbage += n

    def wait_for_calls(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        return self.wait_for_requests(n, timeout)

    def _handle(self, handler, request):
        # Everything is decided (and billed) before the request is recorded and `request_started` is set,
        # so a test that sees the call can rely on `billed` at once, even while `delay` holds the answer.
        status, answer, headers, content_type = self._decide(request)
        self._record(request)
        self._sleep_delay()
        self._respond(handler, request, status, answer, content_type, headers)

    def _decide(self, request):
        if request.method != "POST" or request.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            request.outcome = "rejected"
            return 404, {"error": {"message": "not found", "code": "404"}}, None, "application/json"
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            request.outcome = "rejected"
            return 401, self._error_answer(request, _error_body(401)), None, "application/json"
        body = request.json
        if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
            request.outcome = "rejected"
            return 400, _error_body(400), None, "application/json"
        with self._lock:
            if self._failures:
                failure = self._failures.popleft()
                request.outcome = "failed"
                headers = {"Retry-After": self.retry_after} if failure in (429, 503) else None
                return failure, _error_body(failure), headers, "application/json"
            if self._garbage:
                self._garbage -= 1
                request.outcome = "garbage"
                return 200, b"<html>upstream hiccup</html>", None, "text/html"
            key = request.idempotency_key
            if key is not None and key in self._answers:
                request.outcome = "replayed"
                return 200, self._answers[key], None, "application/json"
            self.billed[key] = self.billed.get(key, 0) + 1
            answer = self._answer(body, number=sum(self.billed.values()))
            if key is not None:
                self._answers[key] = answer
            request.outcome = "billed"
            return 200, answer, None, "application/json"

    def _answer(self, body: dict, number: int) -> dict:
        content = self.reply(body) if callable(self.reply) else str(self.reply)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if isinstance(content, dict):
            calls = content.get("tool_calls") or []
            message = {"role": "assistant", "content": content.get("content")}
            message["tool_calls"] = [
                {
                    "id": f"call_{number}_{n}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments") or {})},
                }
                for n, call in enumerate(calls)
            ]
            content = " ".join([str(content.get("content") or ""), *(json.dumps(c) for c in calls)])
        prompt_tokens = max(1, sum(_words(m.get("content") or "") for m in body["messages"]))
        completion_tokens = max(1, _words(content))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def sign(secret: str | bytes, body: bytes) -> str:
    """The X-PAL-Signature value PAL must send for ``body``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


class WebhookReceiver(_HTTPPeer):
    """Accepts webhooks on any path, checks their signature and counts deliveries per Idempotency-Key.

    ``requests``: everything that arrived; ``deliveries``: the ones it accepted (answered 2xx);
    ``dedup``: Idempotency-Key -> number of accepted deliveries. A receiver does not dedup by itself:
    a count above 1 means PAL delivered twice. With ``reject_invalid=True`` a bad signature gets 401.
    While ``unavailable`` is set, every request gets 503 (the receiver is down behind its proxy).
    """

    def __init__(self, *, secret: str | bytes | None = None, reject_invalid: bool = False):
        super().__init__()
        self.secret = secret
        self.reject_invalid = reject_invalid
        self.unavailable = False
        self.deliveries: list[RecordedRequest] = []

    @property
    def url(self) -> str:
        return f"{self.base_url}/hook"

    @property
    def dedup(self) -> dict[str | None, int]:
        with self._lock:
            return dict(collections.Counter(d.idempotency_key for d in self.deliveries))

    def env(self) -> dict[str, str]:
        secret = self.secret.decode() if isinstance(self.secret, bytes) else (self.secret or "")
        return {"PAL_WEBHOOK_SECRET": secret}

    def wait_for_deliveries(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.deliveries) >= n, timeout):
                raise AssertionError(f"WebhookReceiver got {len(self.deliveries)} deliveries, expected {n}")
            return list(self.deliveries)

    def _handle(self, handler, request):
        if self.secret is not None:
            got = request.headers.get("X-PAL-Signature", "")
            request.signature_valid = hmac.compare_digest(got.encode(), sign(self.secret, request.body).encode())
        with self._lock:
            failure = self._failures.popleft() if self._failures else (503 if self.unavailable else None)
            if failure is None and self.reject_invalid and request.signature_valid is False:
                failure = 401
            if failure is None:
                # Accepted on arrival: a sender killed while we sleep in `delay` has still delivered.
                request.outcome = "delivered"
                self.deliveries.append(request)
            else:
                request.outcome = "failed"
        self._record(request)
        self._sleep_delay()
        if failure is not None:
            return self._respond(
                handler, request, failure, self._error_answer(request, {"ok": False, "status": failure})
            )
        self._respond(handler, request, 200, {"ok": True})


@dataclass
class ReceivedMail:
    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    message: EmailMessage = field(repr=False)


class _EphemeralPortController(Controller):
    """aiosmtpd's Controller, bound to a port the kernel picks (its own needs a fixed port)."""

    def _create_server(self):
        async def create():
            server = await self.loop.create_server(
                self._factory_invoker, host=self.hostname, port=0, ssl=self.ssl_context
            )
            self.port = server.sockets[0].getsockname()[1]
            return server

        return create()


class SMTPSink:
    """An SMTP server that keeps every message. ``messages``: parsed ``EmailMessage`` objects;
    ``message_ids``: their Message-ID headers; ``mails``: envelope sender/recipients and raw bytes too.
    ``fail_next(n, code)`` answers the DATA of the next ``n`` messages with a temporary failure."""

    def __init__(self):
        self.delay = 0.0
        self.request_started = threading.Event()
        self.mails: list[ReceivedMail] = []
        self._failures: collections.deque[int] = collections.deque()
        self._lock = threading.Condition()
        self._controller: _EphemeralPortController | None = None

    def start(self):
        assert self._controller is None, "already started"
        self._controller = _EphemeralPortController(self, hostname=HOST, port=0)
        self._controller.start()
        return self

    def stop(self):
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        assert self._controller is not None, "not started"
        return self._controller.port

    @property
    def url(self) -> str:
        return f"smtp://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """Settings that make Django send mail here."""
        return {"EMAIL_HOST": HOST, "EMAIL_PORT": str(self.port), "EMAIL_USE_TLS": "false"}

    @property
    def messages(self) -> list[EmailMessage]:
        with self._lock:
            return [m.message for m in self.mails]

    @property
    def message_ids(self) -> list[str]:
        with self._lock:
            return [str(m.message["Message-ID"]) for m in self.mails if m.message["Message-ID"] is not None]

    def fail_next(self, n: int = 1, code: int = 451):
        with self._lock:
            self._failures.extend([code] * n)

    def wait_for_messages(self, n: int, timeout: float = 10.0) -> list[EmailMessage]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.mails) >= n, timeout):
                raise AssertionError(f"SMTPSink got {len(self.mails)} messages, expected {n}")
            return [m.message for m in self.mails]

    # aiosmtpd handler hook, called on the controller's event loop.
    async def handle_DATA(self, server, session, envelope):
        self.request_started.set()
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        with self._lock:
            failure = self._failures.popleft() if self._failures else None
        if failure is not None:
            return f"{failure} simulated failure"
        raw = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode()
        mail = ReceivedMail(
            mail_from=envelope.mail_from,
            rcpt_tos=list(envelope.rcpt_tos),
            raw=raw,
            message=email.message_from_bytes(raw, policy=email.policy.default),
        )
        with self._lock:
            self.mails.append(mail)
            self._lock.notify_all()
        return "250 Message accepted for delivery"

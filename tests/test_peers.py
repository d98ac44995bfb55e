"""The test peers behave like the real services the durability tests stand them in for."""

import contextlib
import os
import smtplib
import threading
import time
from email.message import EmailMessage

import httpx
import pytest

from tests.support import workers as worker_support
from tests.support.peers import LLMProvider, WebhookReceiver, sign

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Summarise the ticket"}]}


def chat(provider, key=None, timeout=10.0, **headers):
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{provider.url}/chat/completions", json=CHAT, headers=headers, timeout=timeout)


# --- LLM provider ----------------------------------------------------------------------------------


def test_provider_answers_like_openai(llm_provider):
    answer = chat(llm_provider, key="run:draft:1").json()

    assert answer["object"] == "chat.completion"
    assert answer["model"] == "gpt-4o-mini"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Reply to: Summarise the ticket"}
    assert answer["choices"][0]["finish_reason"] == "stop"
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_provider_bills_a_repeated_idempotency_key_once(llm_provider):
    first = chat(llm_provider, key="run:draft:1").json()
    second = chat(llm_provider, key="run:draft:1").json()

    assert second == first
    assert len(llm_provider.calls) == 2
    assert [c.outcome for c in llm_provider.calls] == ["billed", "replayed"]
    assert llm_provider.billed == {"run:draft:1": 1}


def test_provider_bills_each_new_key(llm_provider):
    chat(llm_provider, key="run:draft:1")
    chat(llm_provider, key="run:draft:2")
    chat(llm_provider)

    assert llm_provider.billed == {"run:draft:1": 1, "run:draft:2": 1, None: 1}
    assert llm_provider.total_billed == 3


def test_provider_records_headers(llm_provider):
    chat(llm_provider, key="k1", Authorization="Bearer sk-test")

    call = llm_provider.calls[0]
    assert call.idempotency_key == "k1"
    assert call.headers["authorization"] == "Bearer sk-test"
    assert call.json == CHAT


def test_provider_checks_the_api_key_when_given_one():
    with LLMProvider(api_key="sk-right") as provider:
        assert chat(provider, key="k", Authorization="Bearer sk-wrong").status_code == 401
        assert chat(provider, key="k", Authorization="Bearer sk-right").status_code == 200
        assert provider.billed == {"k": 1}
        assert provider.env() == {"PAL_LLM_BASE_URL": provider.url, "PAL_LLM_API_KEY": "sk-right"}


@pytest.mark.parametrize("status", [500, 429, 400])
def test_provider_fail_next_answers_errors_without_billing(llm_provider, status):
    llm_provider.fail_next(2, status)

    statuses = [chat(llm_provider, key="k").status_code for _ in range(3)]

    assert statuses == [status, status, 200]
    assert llm_provider.billed == {"k": 1}
    assert [c.outcome for c in llm_provider.calls] == ["failed", "failed", "billed"]


def test_provider_garbage_next_answers_a_body_that_is_not_json(llm_provider):
    llm_provider.garbage_next(1)

    broken = chat(llm_provider, key="k")
    with pytest.raises(ValueError):
        broken.json()
    assert chat(llm_provider, key="k").json()["object"] == "chat.completion"
    assert llm_provider.billed == {"k": 1}


def test_provider_bills_a_call_whose_client_gave_up_and_replays_it(llm_provider):
    llm_provider.delay = 2.0
    with pytest.raises(httpx.ReadTimeout):
        chat(llm_provider, key="run:draft:1", timeout=0.2)
    assert llm_provider.billed == {"run:draft:1": 1}

    llm_provider.delay = 0
    replay = chat(llm_provider, key="run:draft:1")

    assert replay.status_code == 200
    assert llm_provider.billed == {"run:draft:1": 1}
    assert llm_provider.calls[-1].outcome == "replayed"


def test_provider_sets_request_started_while_the_answer_is_delayed(llm_provider):
    llm_provider.delay = 5.0

    def waiting_client():
        # Stopping the provider below may close the connection before an answer: that error is not this test's.
        with contextlib.suppress(httpx.HTTPError):
            chat(llm_provider, "k", timeout=30)

    client = threading.Thread(target=waiting_client, daemon=True)
    client.start()

    assert llm_provider.request_started.wait(10)
    assert client.is_alive()  # still waiting for the answer: the moment to kill a worker
    assert llm_provider.billed == {"k": 1}
    llm_provider.stop()  # wakes the delayed handler
    client.join(10)


def test_provider_answers_unknown_paths_with_404(llm_provider):
    assert httpx.post(f"{llm_provider.base_url}/v2/other", json=CHAT).status_code == 404
    assert llm_provider.billed == {}


# --- webhook receiver ------------------------------------------------------------------------------


def deliver(receiver, body: bytes, key: str, secret="test-webhook-secret"):
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, "X-PAL-Signature": sign(secret, body)}
    return httpx.post(receiver.url, content=body, headers=headers, timeout=10)


def test_receiver_verifies_the_signature(webhook_receiver):
    assert deliver(webhook_receiver, b'{"summary": "ok"}', "k1").status_code == 200
    assert deliver(webhook_receiver, b'{"summary": "ok"}', "k2", secret="wrong").status_code == 200

    assert [d.signature_valid for d in webhook_receiver.deliveries] == [True, False]
    assert webhook_receiver.deliveries[0].json == {"summary": "ok"}


def test_receiver_can_reject_bad_signatures():
    with WebhookReceiver(secret="s3cret", reject_invalid=True) as receiver:
        assert deliver(receiver, b"{}", "k", secret="wrong").status_code == 401
        assert deliver(receiver, b"{}", "k", secret="s3cret").status_code == 200
        assert receiver.dedup == {"k": 1}
        assert receiver.env() == {"PAL_WEBHOOK_SECRET": "s3cret"}


def test_receiver_counts_deliveries_per_key(webhook_receiver):
    for key in ["a", "b", "a"]:
        deliver(webhook_receiver, b"{}", key)

    assert webhook_receiver.dedup == {"a": 2, "b": 1}


def test_receiver_fail_next_answers_errors_and_does_not_count_them(webhook_receiver):
    webhook_receiver.fail_next(1, 503)

    assert deliver(webhook_receiver, b"{}", "k").status_code == 503
    assert deliver(webhook_receiver, b"{}", "k").status_code == 200
    assert len(webhook_receiver.requests) == 2
    assert webhook_receiver.dedup == {"k": 1}


def test_receiver_counts_a_delivery_whose_sender_gave_up(webhook_receiver):
    webhook_receiver.delay = 2.0
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(webhook_receiver.url, content=b"{}", headers={"Idempotency-Key": "k"}, timeout=0.2)

    assert webhook_receiver.request_started.is_set()
    assert webhook_receiver.dedup == {"k": 1}


# --- SMTP sink -------------------------------------------------------------------------------------


def send_mail(sink, message_id="<run.mail.1@pal>"):
    msg = EmailMessage()
    msg["From"] = "pal@localhost"
    msg["To"] = "ops@example.com"
    msg["Subject"] = "Ticket 42"
    msg["Message-ID"] = message_id
    msg.set_content("The summary")
    with smtplib.SMTP(sink.host, sink.port, timeout=10) as smtp:
        smtp.send_message(msg)


def test_smtp_sink_receives_a_message_sent_with_smtplib(smtp_sink):
    send_mail(smtp_sink)

    (message,) = smtp_sink.wait_for_messages(1)
    assert message["Subject"] == "Ticket 42"
    assert message.get_content().strip() == "The summary"
    assert smtp_sink.message_ids == ["<run.mail.1@pal>"]
    assert smtp_sink.mails[0].rcpt_tos == ["ops@example.com"]
    assert smtp_sink.env()["EMAIL_PORT"] == str(smtp_sink.port)


def test_smtp_sink_fail_next_refuses_the_message(smtp_sink):
    smtp_sink.fail_next(1, 451)

    with pytest.raises(smtplib.SMTPDataError):
        send_mail(smtp_sink)
    send_mail(smtp_sink)

    assert smtp_sink.message_ids == ["<run.mail.1@pal>"]


# --- worker processes ------------------------------------------------------------------------------


def test_database_url_names_the_test_database():
    url = worker_support.database_url(
        {
            "ENGINE": "django.db.backends.postgresql",
            "USER": "pal",
            "PASSWORD": "p@ss",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "NAME": "test_pal",
        }
    )

    assert url == "postgres://pal:p%40ss@127.0.0.1:5432/test_pal"


@pytest.mark.integration
def test_celery_workers_start_answer_and_die_with_their_whole_group(celery_workers):
    worker = celery_workers(concurrency=2)
    from pal.celery import app

    # A ping is a broadcast (Redis pub/sub): one published before the worker's loop has subscribed (its log says
    # "ready" just before) reaches nobody, so ask again until one is answered.
    deadline, replies = time.monotonic() + 30, []
    while not replies and time.monotonic() < deadline:
        replies = app.control.ping(destination=[worker.node_name], timeout=1, limit=1) or []
    assert any(worker.node_name in reply for reply in replies), f"no answer to a ping in 30 s: {replies}"

    worker.kill()

    assert not worker.alive
    with pytest.raises(ProcessLookupError):
        os.killpg(worker.pid, 0)  # no process of the group (prefork children included) is left

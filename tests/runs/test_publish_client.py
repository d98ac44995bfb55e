"""A run's message goes out through the process's pooled producers without a new Redis client per publish (issue
15 section 1): kombu's Redis channel made one around its connection pool for every message. One per channel now,
which must hold across the web's threads and across a broker connection that goes away."""

import json
import threading
import uuid

from celery import current_app
from kombu.common import maybe_declare

from runs.dispatch import _ChannelClient, _declared, drives_send


def _sent_task_ids(redis_broker) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in redis_broker.lrange("celery", 0, -1)]


def _send_one() -> str:
    task_id = str(uuid.uuid4())
    drives_send([(uuid.uuid4(), task_id)])
    return task_id


def test_a_pooled_producers_channel_publishes_every_message_with_the_one_client_it_made(redis_broker):
    sent = [_send_one() for _ in range(3)]

    assert sorted(_sent_task_ids(redis_broker)) == sorted(sent)
    with current_app.producer_or_acquire() as producer:
        make = producer.channel._create_client
        assert isinstance(make, _ChannelClient)
        assert make() is make() is make.client
        assert make.client.connection_pool is producer.channel.pool  # the channel's sockets, as before


def test_sends_from_many_threads_at_once_each_arrive_once(redis_broker):
    sent: list[str] = []
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def sender():
        start.wait()
        try:
            for _ in range(25):
                sent.append(_send_one())
        except BaseException as exc:  # the assertion below names it
            failures.append(exc)

    threads = [threading.Thread(target=sender) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    arrived = _sent_task_ids(redis_broker)
    assert len(arrived) == len(set(arrived)) == 200 and sorted(arrived) == sorted(sent)


def test_after_the_broker_drops_the_processs_connections_the_next_send_still_arrives(redis_broker):
    first = _send_one()
    with current_app.producer_or_acquire() as producer:
        pool = producer.channel.pool
        ours = {
            "{}:{}".format(*conn._sock.getsockname()[:2])
            for conn in [*pool._available_connections, *pool._in_use_connections]
            if getattr(conn, "_sock", None) is not None
        }
    killed = [
        redis_broker.client_kill(client["addr"])  # the broker went away for these sockets only
        for client in redis_broker.client_list()
        if client["addr"] in ours
    ]
    assert killed and all(killed)

    second = _send_one()

    assert sorted(_sent_task_ids(redis_broker)) == sorted([first, second])


def test_a_connection_declares_the_drive_queue_until_it_has_and_every_later_message_still_arrives(redis_broker):
    queue = current_app.amqp.router.route({}, "runs.tasks.drive")["queue"]
    with current_app.connection_for_write() as connection:
        assert not _declared(connection, queue)  # a new connection: drives_send lets Celery declare it
        maybe_declare(queue, connection.default_channel)
        assert _declared(connection, queue)  # kombu's own record, which maybe_declare itself goes by
    assert redis_broker.smembers("_kombu.binding.celery")

    sent = [_send_one() for _ in range(3)]

    assert sorted(_sent_task_ids(redis_broker)) == sorted(sent)

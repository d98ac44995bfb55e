"""The workers' consumer (CELERY_WORKER_CONSUMER): Celery's, trying a lost broker again every second, and living
through the loss."""

# - Celery tries a lost broker again after 2, 4, 6 ... up to 30 s (kombu's ensure_connection defaults, which no
# setting changes) (docs/PERFORMANCE-code.md). Tried every
# second, and for as long as it takes (CELERY_BROKER_CONNECTION_MAX_RETRIES None), they take work within about a
# second of it.
# - A worker holding unacknowledged messages (tasks running, acks late) died at the loss or at the return
# ("Unrecoverable error: AttributeError ... 'hostname'"): Celery collects the broken connection, and kombu's collect
# drops the URL from its transport, which the old channel still reads when it restores those messages on close, or
# acknowledges one whose task ends later. Given back its URL, the old channel does either against the broker, or fails
# with a connection error that Celery logs and passes by; the runs are the sweep's in any case (leases).
# A module of its own: only a worker loads it (by the setting's name), not every process that imports pal.celery.

import functools

from celery.worker.consumer import Consumer as CeleryConsumer

BROKER_RETRY_SECONDS = 1.0


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn):
        every = BROKER_RETRY_SECONDS
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=every, interval_step=0, interval_max=every
        )
        return super().ensure_connected(conn)

    def on_connection_error_after_connected(self, exc):
        connection = self.connection
        if connection is not None:
            connection.collect = functools.partial(_collect_keeping_url, connection, connection.collect)
        return super().on_connection_error_after_connected(exc)


def _collect_keeping_url(connection, collect, *args, **kwargs) -> None:
    transport = connection._transport
    try:
        collect(*args, **kwargs)
    finally:
        if transport is not None and transport.client is None:
            transport.client = connection  # what the old channel's pool is made from (kombu's _connparams)

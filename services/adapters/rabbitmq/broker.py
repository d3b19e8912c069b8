"""The Broker port on RabbitMQ (pika's asyncio adapter): the four concerns put together.

Contract: what services/ports/broker.py promises, with each concern in a module of its own:

- connection.py: one connection per process, failover across the nodes of a cluster; calls in
  flight on a lost connection fail with BackendUnavailable (the client sees UNAVAILABLE);
- topology.py: the exchanges and queues of each mail queue, the delay ladder, the dead-letter
  queues, declared (or, for a user without the configure permission, waited for);
- publishing.py: mandatory, confirmed, pipelined publishes;
- consuming.py: consumers that turn deliveries into ``Message`` objects;
- alarms.py: the broker's resource alarms as this process sees them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from pika.channel import Channel

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.alarms import AlarmWatch
from services.adapters.rabbitmq.channels import Waiters
from services.adapters.rabbitmq.connection import NodeConnection
from services.adapters.rabbitmq.consuming import RabbitMQConsumer, subscribe
from services.adapters.rabbitmq.publishing import Publishing
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.adapters.rabbitmq.topology import Topology
from services.domain import model, names
from services.domain.errors import BackendUnavailable
from services.ports.broker import Broker


class RabbitMQBroker(Broker):
    def __init__(self, settings: RabbitMQSettings, keyspace: str = "mailqueue") -> None:
        self._conn = NodeConnection(settings)
        self._topology = Topology(self._conn, settings, keyspace)
        self._publishing = Publishing(self._conn, self._topology, settings)
        self.delivery_limit = settings.delivery_limit if settings.queue_type == "quorum" else None

    async def declare_queue(self, queue: str) -> None:
        await self._topology.declare_queue(queue)

    async def delete_queue(self, queue: str) -> None:
        await self._topology.delete_queue(queue)

    async def ready_messages(self, queue: str) -> int:
        return sum([await self._topology.message_count(names.work_queue(queue, p)) for p in model.PRIORITIES])

    async def publish(
        self, mail: model.QueuedMail, delay: dt.timedelta = dt.timedelta(0), counted: bool | None = None,
        content: bytes | None = None, reservation: tuple[int, int] | None = None,
    ) -> None:
        await self._publishing.publish(mail, delay, counted, content, reservation)

    async def publish_batch(self, exchange: str, routing_key: str, messages: Sequence[message_format.Encoded]) -> None:
        """Publish every message at once on the shared confirm channel and wait once for all their
        confirms (see publishing.py)."""
        await self._publishing.publish_batch(exchange, routing_key, messages)

    async def consume(self, queue: str, prefetch: int) -> RabbitMQConsumer:
        await self._topology.declare_queue(queue)
        try:
            return await subscribe(self._conn, {p: names.work_queue(queue, p) for p in model.PRIORITIES}, prefetch)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e):
                self._topology.forget(queue)  # removed since it was declared here: declared again next time
            raise

    async def consume_dead_letters(self, prefetch: int) -> RabbitMQConsumer:
        await self._topology.ensure_marks_queue()
        return await subscribe(self._conn, {"normal": self._topology.marks_queue}, prefetch)

    async def open_channel(self) -> tuple[Channel, Waiters]:
        """A new channel on this process's connection (its futures in the Waiters): the caller closes it."""
        return await self._conn.channel()

    async def answer(self, waiters: Waiters, method: Callable[..., Any], **kwargs: Any) -> Any:
        """Call a channel method and wait for the broker's answer (BackendUnavailable if none in time)."""
        return await self._conn.call(waiters, method, **kwargs)

    async def ping(self) -> None:
        await self._conn.connection()

    def blocked(self) -> str | None:
        return self._conn.blocking.reason()

    async def watch_alarms(self) -> None:
        await AlarmWatch(self._conn.open_current_node, self._conn.blocking).run()

    async def close(self) -> None:
        self._conn.close()

"""The message broker interface: what the domain needs from RabbitMQ (see brokers/rabbitmq.py).

Contracts:
- ``publish`` returns only once the broker confirmed the message is durably routed to the
  queue's work queue; otherwise it raises BackendUnavailable. Many publishes may be in flight
  at once (confirms are pipelined).
- A consumer's unacknowledged deliveries return to the queue when it is closed or its
  connection dies.
"""

from __future__ import annotations

import abc
import dataclasses


@dataclasses.dataclass(frozen=True)
class Message:
    delivery_tag: int
    body: bytes
    redelivered: bool
    message_id: str | None
    #: Earlier deliveries that were returned to the queue (quorum queues' x-delivery-count).
    delivery_count: int = 0


class Consumer(abc.ABC):
    @abc.abstractmethod
    async def get(self) -> Message:
        """The next delivery (waits). Raises BackendUnavailable when the channel died."""

    @abc.abstractmethod
    async def ack(self, delivery_tag: int) -> None: ...

    @abc.abstractmethod
    async def requeue(self, delivery_tag: int) -> None:
        """Put the message back at the head of its queue, for any consumer."""

    @abc.abstractmethod
    async def dead_letter(self, delivery_tag: int) -> None:
        """Route the message to the queue's dead-letter queue."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop consuming; unacknowledged deliveries go back to the queue."""


class Broker(abc.ABC):
    #: Deliveries returned to the queue after which the broker dead-letters a message by itself
    #: (None: no limit).
    delivery_limit: int | None = None

    @abc.abstractmethod
    async def declare_queue(self, queue: str) -> None:
        """Declare (idempotently) a mail queue's exchange, work queue and dead-letter queue."""

    @abc.abstractmethod
    async def publish(self, queue: str, message_id: str, body: bytes) -> None: ...

    @abc.abstractmethod
    async def consume(self, queue: str, prefetch: int) -> Consumer: ...

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise BackendUnavailable unless the broker answers."""

    @abc.abstractmethod
    async def close(self) -> None: ...

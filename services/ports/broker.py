"""The message broker interface: what the domain needs from RabbitMQ (see services/adapters/rabbitmq/, broker.py and the modules it names).

Contracts:
- ``publish`` returns only once the broker confirmed the message is durably routed to the
  queue's work queue; otherwise it raises BackendUnavailable. Many publishes may be in flight
  at once (confirms are pipelined). While the broker blocks publishers (a resource alarm), it
  raises PublishersBlocked at once, and so do the publishes waiting for a confirm when the block
  began: a confirm would wait until the alarm is lifted.
- A consumer's unacknowledged deliveries return to the queue when it is closed or its
  connection dies.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt

from services.domain import model


@dataclasses.dataclass(frozen=True)
class Message(abc.ABC):
    """A delivery. The broker's adapter reads the mail out of the body (``mail``): this interface
    knows no message format."""

    delivery_tag: int
    body: bytes
    redelivered: bool
    message_id: str | None
    #: Earlier deliveries that were returned to the queue (quorum queues' x-delivery-count).
    delivery_count: int = 0
    #: The schedule generation the message was published with (QueuedMail.generation).
    generation: int = 0
    #: Why the broker dead-lettered the message last, if it did ("delivery_limit", "rejected", ...).
    death_reason: str | None = None
    #: The delivery class of the work queue it came from.
    priority: str = "normal"
    #: Published with a delay (it went through the delay ladder): its arrival ends the delay.
    delayed: bool = False
    #: The mail's content when the message carries it (small mail, see ``Broker.publish``), else None.
    content: bytes | None = None
    #: A mail that waited for room at its destination: (its slot in ms since the epoch, the stamp
    #: it was reserved under), services/app/shaper.py.
    reservation: tuple[int, int] | None = None

    @abc.abstractmethod
    def mail(self) -> model.QueuedMail:
        """The mail it carries, with its generation. Raises on an undecodable body."""


class Consumer(abc.ABC):
    @abc.abstractmethod
    async def get(self) -> Message:
        """The next delivery (waits). Raises BackendUnavailable when the channel died."""

    @abc.abstractmethod
    async def ack(self, delivery_tag: int) -> None:
        """Acknowledge a delivery. It may leave a moment later, with others: write what the ack
        stands for first (a process that dies before it left has the message delivered again)."""

    @abc.abstractmethod
    async def dead_letter(self, delivery_tag: int) -> None:
        """Route the message to the queue's dead-letter queue."""

    @abc.abstractmethod
    def drain(self) -> list[Message]:
        """The deliveries received but not yet taken with ``get`` (no wait)."""

    async def stop(self) -> None:
        """Ask the broker to deliver nothing more (what it delivered before stays to be answered),
        so that acks given while closing free no room it would fill with new deliveries.
        BackendUnavailable when the channel is gone. (None: a consumer that is never sent more.)"""
        return None

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
    async def publish(
        self, mail: model.QueuedMail, delay: dt.timedelta = dt.timedelta(0), counted: bool | None = None,
        content: bytes | None = None, reservation: tuple[int, int] | None = None,
    ) -> None:
        """Publish ``mail`` to its queue, deliverable after ``delay`` (services/domain/delays.py), with
        its generation. ``counted``: the message's arrival ends a delay the queue counters count
        (default: when ``delay`` is not zero). ``content``: the mail's content, carried in the
        message so that its delivery reads no blob (callers pass it for small mail only; a
        message without it is delivered all the same, its content read from the blob store).
        ``reservation``: carried to the consumer (a slot reserved at the mail's destination).
        Returns once the broker confirmed it; raises BackendUnavailable."""

    @abc.abstractmethod
    async def consume(self, queue: str, prefetch: int) -> Consumer:
        """Consume every delivery class of ``queue``, each with ``prefetch`` unacknowledged at most."""

    @abc.abstractmethod
    async def consume_dead_letters(self, prefetch: int) -> Consumer:
        """Consume the copies of every queue's dead letters (names.dead_letter_marks_queue)."""

    @abc.abstractmethod
    async def delete_queue(self, queue: str) -> None:
        """Remove a mail queue's exchanges, work queues and dead-letter queue (idempotently).
        Their consumers are cancelled; messages still in the delay ladder for it are dropped
        when they arrive."""

    @abc.abstractmethod
    async def ready_messages(self, queue: str) -> int:
        """Messages waiting in the queue's work queues (not those handed out, nor in the delay ladder)."""

    @abc.abstractmethod
    def blocked(self) -> str | None:
        """Why the broker blocks publishers now, in its words ("low on disk", "low on memory"), or
        None while it accepts them. From what the broker told this process: no I/O."""

    @abc.abstractmethod
    async def watch_alarms(self) -> None:
        """Keep ``blocked`` current while nothing is published too (runs until cancelled): a
        process that must refuse before it writes anything (enqueue) runs it."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise BackendUnavailable unless the broker answers."""

    @abc.abstractmethod
    async def close(self) -> None: ...

"""Consuming from RabbitMQ: deliveries become ``Message`` objects the use-cases read.

Contract: ``subscribe`` opens one channel with one consumer per RabbitMQ queue, each with
``prefetch`` unacknowledged messages (per-consumer QoS): delivery tags stay unique on the channel,
and a busy delivery class never takes another's credit. A subscription that fails or is cancelled
half-way closes its channel (nothing is left holding messages). Once the channel closes, or the
broker cancels the consumer (its queue was deleted), every ``get`` fails with BackendUnavailable.

Acks are gathered for ``ACK_DELAY_S`` and leave together: the oldest run of outstanding tags as
one ``basic.ack`` with ``multiple``, the rest one by one. Each ack sent alone is a TLS record and
a system call of its own. An ack still waiting when the process or the channel dies is a message
delivered again, as when a process dies just before its ack: a settled mail's mark makes the view
skip it; a message that was published again unchanged (a wait, a stream's unsent messages) is
then a second copy of the same generation: a duplicate delivery at worst, as when a process dies
between that publish and its ack.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from pika.channel import Channel

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.channels import Waiters, consumer_closed, unavailable
from services.adapters.rabbitmq.connection import NodeConnection
from services.ports.broker import Consumer, Message

log = logging.getLogger(__name__)

_CLOSED = object()

#: How long an ack waits for others to leave with it.
ACK_DELAY_S = 0.002


def ack_frames(outstanding: list[int], acked: set[int]) -> tuple[int | None, list[int]]:
    """How to ack ``acked``, given every outstanding tag of the channel in order: the highest tag
    of the oldest run that is wholly acked (one ``multiple`` ack, when the run has two or more),
    and the tags to ack one by one."""
    run = 0
    while run < len(outstanding) and outstanding[run] in acked:
        run += 1
    if run < 2:
        return None, sorted(acked)
    covered = set(outstanding[:run])
    return outstanding[run - 1], sorted(acked - covered)


#: How long a closing stream waits for the broker to confirm it sends no more.
STOP_TIMEOUT_S = 5.0


class RabbitMQConsumer(Consumer):
    def __init__(self, channel: Channel, waiters: Waiters) -> None:
        self._channel = channel
        self._waiters = waiters
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._cancelled: str | None = None
        #: Tags delivered on the channel and not acked nor rejected yet, in delivery order.
        self._outstanding: dict[int, None] = {}
        self._acks: set[int] = set()
        self._flush: asyncio.TimerHandle | None = None
        channel.add_on_close_callback(lambda _ch, reason: self._inbox.put_nowait(_CLOSED))
        # The broker cancels a consumer whose queue was deleted (DeleteQueue): end like a closed channel.
        channel.add_on_cancel_callback(lambda _frame: self._on_cancel())

    def _on_cancel(self) -> None:
        self._cancelled = "consumer cancelled by the broker: its queue was deleted"
        self._inbox.put_nowait(_CLOSED)

    def on_message(self, priority: str, _ch: Channel, method: Any, props: Any, body: bytes) -> None:
        self._outstanding[method.delivery_tag] = None  # before decoding: a message that fails it is still out
        d = message_format.decode(props.headers, body)
        self._inbox.put_nowait(message_format.RabbitMQMessage(
            method.delivery_tag, d.mail_bytes, bool(method.redelivered), props.message_id, d.delivery_count,
            d.generation, d.death_reason, priority, d.delayed, d.content, d.reservation,
        ))

    def drain(self) -> list[Message]:
        items = []
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if item is _CLOSED:
                self._inbox.put_nowait(_CLOSED)
                break
            items.append(item)
        return items

    async def get(self) -> Message:
        item = await self._inbox.get()
        if item is _CLOSED:
            self._inbox.put_nowait(_CLOSED)  # every later get fails too
            raise consumer_closed(self._cancelled or self._waiters.closed_reason)
        return item

    def _ensure_open(self) -> None:
        if not self._channel.is_open:
            raise unavailable(self._waiters.closed_reason or "consumer channel closed")  # closing.py gives back on it

    async def ack(self, delivery_tag: int) -> None:
        self._ensure_open()
        self._acks.add(delivery_tag)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(ACK_DELAY_S, self.flush_acks)

    def flush_acks(self) -> None:
        """Send the acks gathered so far (at once, not after ``ACK_DELAY_S``)."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        acks, self._acks = self._acks, set()
        if not acks or not self._channel.is_open:
            return  # a closed channel's messages go back to the queue: the view skips them
        multiple, singles = ack_frames(list(self._outstanding), acks)
        if multiple is not None:
            self._channel.basic_ack(multiple, multiple=True)
        for tag in singles:
            self._channel.basic_ack(tag)
        for tag in acks:
            self._outstanding.pop(tag, None)

    async def dead_letter(self, delivery_tag: int) -> None:
        self._ensure_open()
        self._channel.basic_nack(delivery_tag, requeue=False)
        self._outstanding.pop(delivery_tag, None)
        self._acks.discard(delivery_tag)  # answered once: a pending ack of it would close the channel

    async def stop(self) -> None:
        """basic.cancel of each consumer of the channel, and their cancel-ok awaited (bounded)."""
        self._ensure_open()
        for tag in list(self._channel.consumer_tags):
            fut = self._waiters.call(lambda callback, t=tag: self._channel.basic_cancel(t, callback=callback))
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await fut
            except TimeoutError:  # a slow broker, the channel still open: the give-back goes on
                log.warning("no answer to basic.cancel in time; giving back the unsent deliveries anyway",
                            extra={"timeout_s": STOP_TIMEOUT_S})
                return

    async def close(self) -> None:
        try:
            self.flush_acks()
        finally:
            if self._channel.is_open:
                self._channel.close()


async def subscribe(connection: NodeConnection, rabbit_queues: dict[str, str], prefetch: int) -> RabbitMQConsumer:
    """One channel, one consumer per queue (``rabbit_queues`` maps a priority to its queue)."""
    channel, w = await connection.channel()
    consumer = RabbitMQConsumer(channel, w)
    try:
        await connection.call(w, channel.basic_qos, prefetch_count=prefetch)
        for priority, rabbit_queue in rabbit_queues.items():
            on_message = functools.partial(consumer.on_message, priority)
            fut = w.call(lambda callback, q=rabbit_queue, m=on_message: channel.basic_consume(q, m, auto_ack=False, callback=callback))
            await connection.answer(fut, "basic.consume")
    except BaseException:
        # Failed or cancelled (a client that leaves while subscribing): a consumer nobody owns
        # would take up to ``prefetch`` messages and hold them unacked until the process ends.
        await consumer.close()
        raise
    return consumer

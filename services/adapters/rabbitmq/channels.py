"""pika plumbing under the RabbitMQ broker: futures for channel calls and publisher confirms,
and the consumer that turns deliveries into ``Message`` objects.

Every future a channel call or a publish waits on fails with BackendUnavailable when its channel
closes, so nothing above waits for an answer that can no longer come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pika
from pika.channel import Channel

from services.adapters.rabbitmq import message_format
from services.domain.errors import BackendUnavailable
from services.ports.broker import Consumer, Message

log = logging.getLogger(__name__)

_CLOSED = object()


def unavailable(detail: Any) -> BackendUnavailable:
    return BackendUnavailable("rabbitmq", str(detail) or type(detail).__name__)


class Waiters:
    """Futures waiting on one channel: all fail together when the channel closes."""

    def __init__(self, channel: Channel) -> None:
        self.futures: set[asyncio.Future[Any]] = set()
        self.closed_reason: Any = None
        channel.add_on_close_callback(self._on_close)

    def new(self) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        # Its awaiter reads the error; one gone meanwhile (its stream ended) never will: read here,
        # never logged as "Future exception was never retrieved".
        fut.add_done_callback(_read_error)
        if self.closed_reason is not None:
            fut.set_exception(unavailable(self.closed_reason))
            return fut
        self.futures.add(fut)
        fut.add_done_callback(self.futures.discard)
        return fut

    def call(self, send: Callable[[Callable[..., None]], Any]) -> asyncio.Future[Any]:
        """The future of the broker's answer to a channel method: ``send(callback)`` makes the call.
        A channel closed before or as it is called (pika raises then): the future fails with
        BackendUnavailable; never a pika error up the stack, nor a future nobody awaits."""
        fut = self.new()
        if fut.done():
            return fut
        try:
            send(resolver(fut))
        except pika.exceptions.AMQPError as e:
            fut.set_exception(unavailable(e))
        return fut

    def _on_close(self, _channel: Channel, reason: Any) -> None:
        self.closed_reason = reason
        for fut in list(self.futures):
            if not fut.done():
                fut.set_exception(unavailable(reason))


def _read_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def resolver(fut: asyncio.Future[Any]) -> Callable[..., None]:
    def done(*args: Any) -> None:
        if not fut.done():
            fut.set_result(args[0] if args else None)

    return done


class Publisher:
    """One confirm-mode channel; maps delivery tags to the futures of waiting publishers.

    A channel that got a nack is retired: on RabbitMQ 3.10, once a quorum queue's leader died
    under a channel, that channel nacks every later publish to the queue even after a new leader
    was elected, while a new channel publishes within a second. The broker opens a new channel
    for the next publish, and the retired one is closed once its last confirm came.
    """

    def __init__(self, channel: Channel, waiters: Waiters) -> None:
        self.channel = channel
        self.waiters = waiters
        self.next_tag = 1
        self.pending: dict[int, tuple[asyncio.Future[None], str]] = {}
        self.returned: set[str] = set()
        self.retired = False
        channel.add_on_return_callback(self._on_return)
        channel.add_on_close_callback(self._on_close)

    def publish(self, exchange: str, routing_key: str, message: message_format.Encoded) -> asyncio.Future[None]:
        message_id = message.message_id
        props = pika.BasicProperties(
            delivery_mode=message.delivery_mode, message_id=message_id, content_type=message.content_type,
            type=message.type, headers=message.headers or None,
        )
        fut = self.waiters.new()
        if fut.done():
            return fut
        try:
            self.channel.basic_publish(exchange, routing_key, message.body, props, mandatory=True)
        except pika.exceptions.AMQPError as e:  # the channel closed under us
            fut.set_exception(unavailable(e))
            return fut
        self.pending[self.next_tag] = (fut, message_id)
        self.next_tag += 1
        return fut

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        ack = isinstance(method, pika.spec.Basic.Ack)
        tags = [t for t in self.pending if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for tag in tags:
            entry = self.pending.pop(tag, None)
            if entry is None:
                continue
            fut, message_id = entry
            if fut.done():
                continue
            if message_id in self.returned:
                self.returned.discard(message_id)
                fut.set_exception(unavailable("message unroutable: the work queue does not exist"))
            elif ack:
                fut.set_result(None)
            else:
                self.retired = True
                fut.set_exception(unavailable("broker refused the message (nack)"))
        if self.retired and not self.pending and self.channel.is_open:
            self.channel.close()

    def fail_pending(self, error: BackendUnavailable) -> None:
        """Fail every publish waiting for its confirm (its connection was blocked: the confirm
        would come only once the alarm is lifted). A confirm that comes later finds nobody waiting."""
        for fut, _ in self.pending.values():
            if not fut.done():
                fut.set_exception(error)

    def _on_return(self, _ch: Channel, _method: Any, props: Any, _body: bytes) -> None:
        self.returned.add(props.message_id)

    def _on_close(self, _ch: Channel, reason: Any) -> None:
        for fut, _ in self.pending.values():
            if not fut.done():
                fut.set_exception(unavailable(reason))
        self.pending.clear()


class RabbitMQConsumer(Consumer):
    def __init__(self, channel: Channel, waiters: Waiters) -> None:
        self._channel = channel
        self._waiters = waiters
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._cancelled: str | None = None
        channel.add_on_close_callback(lambda _ch, reason: self._inbox.put_nowait(_CLOSED))
        # The broker cancels a consumer whose queue was deleted (DeleteQueue): end like a closed channel.
        channel.add_on_cancel_callback(lambda _frame: self._on_cancel())

    def _on_cancel(self) -> None:
        self._cancelled = "consumer cancelled by the broker: its queue was deleted"
        self._inbox.put_nowait(_CLOSED)

    def on_message(self, priority: str, _ch: Channel, method: Any, props: Any, body: bytes) -> None:
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
            raise unavailable(self._cancelled or self._waiters.closed_reason or "consumer channel closed")
        return item

    def _ensure_open(self) -> None:
        if not self._channel.is_open:
            raise unavailable(self._waiters.closed_reason or "consumer channel closed")

    async def ack(self, delivery_tag: int) -> None:
        self._ensure_open()
        self._channel.basic_ack(delivery_tag)

    async def dead_letter(self, delivery_tag: int) -> None:
        self._ensure_open()
        self._channel.basic_nack(delivery_tag, requeue=False)

    async def close(self) -> None:
        if self._channel.is_open:
            self._channel.close()

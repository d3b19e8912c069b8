"""Publishing to RabbitMQ: mandatory, confirmed, pipelined on one confirm channel per connection.

Contract: ``publish`` resolves when the broker acked the message and did not return it as
unroutable (for a quorum queue, once a majority of its members has it); otherwise it raises
BackendUnavailable, or PublishersBlocked while the broker blocks publishers (a resource alarm:
its confirm would wait for the alarm to be lifted, so it is refused at once). Hundreds of
publishes can wait for their confirms at once. A confirm that does not come within
``confirm_timeout_s`` makes the process leave the node (hung, or cut off from its quorum).
A delayed mail enters the delay ladder (topology.py) at the level its delay starts from.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Sequence
from typing import Any

import pika
from pika.channel import Channel

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.channels import Waiters, unavailable
from services.adapters.rabbitmq.connection import NodeConnection
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.adapters.rabbitmq.topology import Topology
from services.domain import delays, model, names
from services.domain.errors import BackendUnavailable, PublishersBlocked

log = logging.getLogger(__name__)


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


class Publishing:
    """The confirm channel of the connection in use, and the publishes waiting on it."""

    def __init__(self, connection: NodeConnection, topology: Topology, settings: RabbitMQSettings) -> None:
        self._conn = connection
        self._topology = topology
        self._settings = settings
        self._lock = asyncio.Lock()
        self._publisher: Publisher | None = None
        connection.subscribe(self._on_switch, self._on_blocked)

    def _on_switch(self) -> None:
        """The connection was replaced or dropped: the next publish opens a new confirm channel."""
        self._publisher = None

    def _on_blocked(self, reason: str) -> None:
        """The broker blocks the connection: the publishes waiting for a confirm on it fail now."""
        if self._publisher is not None:
            self._publisher.fail_pending(PublishersBlocked(reason))

    def _usable(self, publisher: Publisher | None) -> bool:
        return publisher is not None and publisher.channel.is_open and not publisher.retired

    async def _publisher_channel(self) -> Publisher:
        if self._usable(self._publisher):
            return self._publisher
        async with self._lock:
            if self._usable(self._publisher):
                return self._publisher
            channel, waiters = await self._conn.channel()
            publisher = Publisher(channel, waiters)
            fut = waiters.call(lambda callback: channel.confirm_delivery(publisher.on_confirm, callback=callback))
            try:
                await self._conn.answer(fut, "confirm.select")
            except BaseException:  # no answer in time, or the caller left: the channel is nobody's
                if channel.is_open:
                    channel.close()
                raise
            self._publisher = publisher
            return publisher

    def _refuse_if_blocked(self) -> None:
        blocked = self._conn.blocking.reason()
        if blocked is not None:
            raise PublishersBlocked(blocked)  # its confirm would wait for the alarm to be lifted

    async def publish(
        self, mail: model.QueuedMail, delay: dt.timedelta = dt.timedelta(0), counted: bool | None = None,
        content: bytes | None = None, reservation: tuple[int, int] | None = None,
    ) -> None:
        self._refuse_if_blocked()
        queue = mail.queue
        await self._topology.declare_queue(queue)
        publisher = await self._publisher_channel()
        n = delays.units(delay)
        message = message_format.encode(mail, content, delayed=bool(n) if counted is None else counted, reservation=reservation)
        if n:
            exchange, key = names.delay_exchange(delays.entry_level(n)), delays.routing_key(n, queue, mail.priority)
        else:
            exchange, key = names.exchange(queue), names.priority_key(mail.priority)
        try:
            await self._confirmed(publisher, publisher.publish(exchange, key, message))
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e) or "unroutable" in str(e):
                # The topology was removed (an operator, a broker reset): declare it again next time.
                # Not after other failures: a declaration is a cluster-wide change that waits for
                # every node, so while one node hangs it would hold up the publishes it precedes.
                self._topology.forget(queue, ladder=True)
            raise

    async def _confirmed(self, publisher: Publisher, confirmed: Awaitable[Any]) -> None:
        """Wait for ``confirmed`` (a publish's confirm, or a batch's); past ``confirm_timeout_s``,
        leave the node (hung, or cut off from its quorum) and raise BackendUnavailable."""
        try:
            async with asyncio.timeout(self._settings.confirm_timeout_s):
                await confirmed
        except TimeoutError:
            conn = self._conn.current
            if conn is not None and publisher is self._publisher:
                log.warning("publish not confirmed; leaving this rabbitmq node", extra={"timeout_s": self._settings.confirm_timeout_s})
                self._conn.leave(conn)
                self._conn.abandon(conn)
            raise unavailable(f"publish not confirmed within {self._settings.confirm_timeout_s}s") from None

    async def publish_batch(self, exchange: str, routing_key: str, messages: Sequence[message_format.Encoded]) -> None:
        """Publish every message at once on the shared confirm channel (with the mails' publishes)
        and wait once for all their confirms: returns when the broker confirmed each; otherwise
        BackendUnavailable (PublishersBlocked while the broker blocks publishers)."""
        self._refuse_if_blocked()
        if not messages:
            return
        publisher = await self._publisher_channel()
        results = asyncio.gather(*(publisher.publish(exchange, routing_key, m) for m in messages), return_exceptions=True)
        # A gather cancelled by the confirm timeout (or its caller) ends with a CancelledError set
        # that wait_for never reads: read here, never "_GatheringFuture exception was never retrieved".
        results.add_done_callback(lambda f: f.cancelled() or f.exception())
        await self._confirmed(publisher, results)
        failed = [r for r in results.result() if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

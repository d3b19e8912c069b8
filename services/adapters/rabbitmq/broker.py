"""RabbitMQ broker on pika's asyncio adapter: one connection per process, confirms pipelined.

Topology per mail queue (names from services/domain/names.py): a durable direct exchange, a work queue
(quorum by default, with a delivery limit so a poison message cannot loop forever) whose dead
letters go to a fanout dead-letter exchange and its durable queue.

Publishing is mandatory and confirmed: ``publish`` resolves when the broker acked the message and
did not return it as unroutable (for a quorum queue, once a majority of its members has it).
Hundreds of publishes can wait for their confirms at once.

Several nodes (a cluster): the broker connects to the first that answers, and when that node dies
(its connection closes, its heartbeats stop, or a confirm does not come within
``confirm_timeout_s``) the next call connects to the next node of the list. Calls in flight on the
lost connection fail with BackendUnavailable (the client sees UNAVAILABLE and retries).

Delays go through the ladder of services/domain/delays.py: shared wait queues with a queue-level TTL
that dead-letter from level to level and finally to the delivery exchange, which routes to the
work queue by name. Quorum wait queues dead-letter at-least-once (RabbitMQ 3.10+), so a broker
restart mid-ladder loses nothing. Every queue's dead-letter exchange also feeds one shared queue
(names.dead_letter_marks_queue) that dequeue_svc reads to mark what the broker dead-lettered.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.alarms import AlarmWatch, Blocking
from services.adapters.rabbitmq.channels import Publisher, RabbitMQConsumer, Waiters, resolver, unavailable
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.domain import delays, model, names
from services.domain.errors import BackendUnavailable, PublishersBlocked
from services.ports.broker import Broker

log = logging.getLogger(__name__)


#: Seconds between checks for a queue that a user who may not declare waits for.
TOPOLOGY_POLL_S = 0.5


def connection_parameters(url: str, settings: RabbitMQSettings) -> pika.URLParameters:
    """pika's parameters for one node; an amqps:// URL is TLS, verified against the settings' CA
    (or the system's) with the URL's host name checked."""
    params = pika.URLParameters(url)
    if url.startswith("amqps://"):
        context = ssl.create_default_context(cafile=settings.ca_file or None)
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    return params


def _close_opened(fut: asyncio.Future[Channel]) -> None:
    """Close a channel that opened for a caller that was cancelled meanwhile."""
    if not fut.cancelled() and fut.exception() is None and fut.result().is_open:
        fut.result().close()

class RabbitMQBroker(Broker):
    def __init__(self, settings: RabbitMQSettings, keyspace: str = "mailqueue") -> None:
        self._settings = settings
        #: The view this broker's queues belong to (names the dead-letter marks queue).
        self._marks_queue = names.dead_letter_marks_queue(keyspace)
        self._nodes = [self._parameters(url, settings) for url in settings.urls]
        #: The node to try first: the one connected last, or the one after a node that failed.
        self._node = 0
        self._conn: AsyncioConnection | None = None
        self._lock = asyncio.Lock()
        self._publisher_lock = asyncio.Lock()
        self._publisher: Publisher | None = None
        self._declared: set[str] = set()
        self._ladder_declared = False
        #: False once a declaration was refused (a user without the configure permission).
        self._may_configure = True
        self.delivery_limit = settings.delivery_limit if settings.queue_type == "quorum" else None
        #: What the broker told this process's connections about its resource alarms.
        self._blocking = Blocking()

    # ------------------------------------------------------------------ connection and channels
    @staticmethod
    def _parameters(url: str, settings: RabbitMQSettings) -> pika.URLParameters:
        params = connection_parameters(url, settings)
        params.connection_attempts = 1
        params.socket_timeout = settings.connect_timeout_s
        params.heartbeat = settings.heartbeat_s
        return params

    async def _connection(self) -> AsyncioConnection:
        if self._conn is not None and self._conn.is_open:
            return self._conn
        async with self._lock:
            if self._conn is not None and self._conn.is_open:
                return self._conn
            failures = []
            for attempt in range(len(self._nodes)):
                i = (self._node + attempt) % len(self._nodes)
                params = self._nodes[i]
                try:
                    conn = await self._open(params)
                except BackendUnavailable as e:
                    failures.append(f"{params.host}:{params.port}: {e.detail}")
                    continue
                self._node, self._conn, self._publisher = i, conn, None
                self._blocking.watch(conn, self._on_blocked)
                log.info("connected to rabbitmq", extra={"host": params.host, "port": params.port})
                return conn
            self._node = (self._node + 1) % len(self._nodes)
            raise unavailable(f"no RabbitMQ node answered ({'; '.join(failures)})")

    async def _open(self, params: pika.URLParameters) -> AsyncioConnection:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[AsyncioConnection] = loop.create_future()

        def on_error(_c: Any, err: Any) -> None:
            if not fut.done():
                fut.set_exception(unavailable(f"cannot connect ({err})"))

        conn = AsyncioConnection(
            params,
            on_open_callback=resolver(fut),
            on_open_error_callback=on_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=loop,
        )
        try:
            await asyncio.wait_for(fut, self._settings.connect_timeout_s)
        except asyncio.TimeoutError:
            self._abandon(conn)
            raise unavailable(f"no answer within {self._settings.connect_timeout_s}s") from None
        return conn

    def _on_connection_closed(self, conn: AsyncioConnection, reason: Any) -> None:
        self._blocking.forget(conn)
        if conn is self._conn:
            log.warning("rabbitmq connection closed", extra={"reason": str(reason)})
            self._leave(conn)

    def _on_blocked(self, conn: AsyncioConnection, reason: str) -> None:
        """The broker blocks ``conn``: the publishes waiting for a confirm on it fail now."""
        if conn is self._conn and self._publisher is not None:
            self._publisher.fail_pending(PublishersBlocked(reason))

    def _leave(self, conn: AsyncioConnection) -> None:
        """Stop using ``conn``: the next call connects to the next node."""
        if conn is self._conn:
            self._conn, self._publisher = None, None
            self._node = (self._node + 1) % len(self._nodes)

    @staticmethod
    def _abandon(conn: AsyncioConnection) -> None:
        """Close a connection whose node may not answer (the close then ends with its heartbeat)."""
        try:
            if not (conn.is_closed or conn.is_closing):
                conn.close()
        except Exception as e:  # noqa: BLE001 - pika's state errors on a connection already going
            log.debug("closing an abandoned rabbitmq connection: %s", e)

    async def _channel(self) -> tuple[Channel, Waiters]:
        conn = await self._connection()
        fut: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
        try:
            conn.channel(on_open_callback=resolver(fut))
        except Exception as e:  # pika raises its own connection-state errors here
            raise unavailable(e) from e
        try:
            channel = await asyncio.wait_for(asyncio.shield(fut), self._settings.connect_timeout_s)
        except asyncio.CancelledError:
            fut.add_done_callback(_close_opened)  # if it opens after all, nobody owns it
            raise
        except asyncio.TimeoutError:
            fut.add_done_callback(_close_opened)
            # A node that cannot open a channel in seconds is gone (its connection may not know yet).
            self._leave(conn)
            self._abandon(conn)
            raise unavailable(f"no channel opened within {self._settings.connect_timeout_s}s") from None
        return channel, Waiters(channel)

    async def _answer(self, fut: asyncio.Future[Any], what: str) -> Any:
        """The broker's answer to a channel call; BackendUnavailable when none comes in time."""
        try:
            return await asyncio.wait_for(fut, self._settings.connect_timeout_s)
        except asyncio.TimeoutError:
            raise unavailable(f"no answer to {what} within {self._settings.connect_timeout_s}s") from None

    async def _call(self, waiters: Waiters, method: Callable[..., Any], **kwargs: Any) -> Any:
        fut = waiters.call(lambda callback: method(callback=callback, **kwargs))
        return await self._answer(fut, getattr(method, "__name__", "a channel call"))

    def _usable(self, publisher: Publisher | None) -> bool:
        return publisher is not None and publisher.channel.is_open and not publisher.retired

    async def _publisher_channel(self) -> Publisher:
        if self._usable(self._publisher):
            return self._publisher
        async with self._publisher_lock:
            if self._usable(self._publisher):
                return self._publisher
            channel, waiters = await self._channel()
            publisher = Publisher(channel, waiters)
            fut = waiters.call(lambda callback: channel.confirm_delivery(publisher.on_confirm, callback=callback))
            await self._answer(fut, "confirm.select")
            self._publisher = publisher
            return publisher

    # ------------------------------------------------------------------ Broker
    def work_queue_arguments(self, queue: str) -> dict[str, Any]:
        args: dict[str, Any] = {"x-dead-letter-exchange": names.dead_letter_exchange(queue)}
        if self._settings.queue_type == "quorum":
            args["x-queue-type"] = "quorum"
            args["x-delivery-limit"] = self._settings.delivery_limit
        return args

    def _queue_type(self) -> dict[str, Any]:
        return {"x-queue-type": "quorum"} if self._settings.queue_type == "quorum" else {}

    def ladder_queue_arguments(self, level: int) -> dict[str, Any]:
        target = names.delay_exchange(level - 1) if level > 0 else names.delay_delivery_exchange()
        args: dict[str, Any] = {**self._queue_type(), "x-message-ttl": delays.ttl_ms(level), "x-dead-letter-exchange": target}
        if self._settings.queue_type == "quorum":
            # At-least-once dead-lettering (3.10+): a message moves to the next level only once
            # the next level confirmed it, so a broker crash mid-ladder cannot lose it.
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"
        return args

    async def _declare_ladder(self) -> None:
        """The delay ladder and the dead-letter marks queue, shared by every queue (idempotent)."""
        if self._ladder_declared:
            return
        await self._declare_unroutable()
        channel, w = await self._channel()
        try:
            deliver, lost = names.delay_delivery_exchange(), names.delay_unroutable()
            await self._call(w, channel.exchange_declare, exchange=deliver, exchange_type="topic", durable=True,
                             arguments={"alternate-exchange": lost})
            for level in range(delays.LEVELS):
                x = names.delay_exchange(level)
                await self._call(w, channel.exchange_declare, exchange=x, exchange_type="topic", durable=True)
                await self._call(w, channel.queue_declare, queue=names.delay_queue(level), durable=True,
                                 arguments=self.ladder_queue_arguments(level))
                await self._call(w, channel.queue_bind, queue=names.delay_queue(level), exchange=x,
                                 routing_key=delays.level_binding(level, "1"))
                lower = names.delay_exchange(level - 1) if level > 0 else deliver
                await self._call(w, channel.exchange_bind, destination=lower, source=x,
                                 routing_key=delays.level_binding(level, "0"))
            await self._call(w, channel.queue_declare, queue=self._marks_queue, durable=True,
                             arguments=self._queue_type())
        finally:
            if channel.is_open:
                channel.close()
        self._ladder_declared = True

    async def _declare_unroutable(self) -> None:
        """Where the ladder puts a delayed mail whose queue is gone. Replicated like every other
        queue: a classic queue lives on one node, and while that node is down its declaration
        fails (404, home node down), which would stop every publish that re-declares the ladder.
        A classic one left by an older version is kept (and said once in the log)."""
        lost = names.delay_unroutable()
        channel, w = await self._channel()
        try:
            await self._call(w, channel.exchange_declare, exchange=lost, exchange_type="fanout", durable=True)
            await self._call(w, channel.queue_declare, queue=lost, durable=True, arguments={
                **self._queue_type(), "x-message-ttl": 7 * 24 * 3600 * 1000, "x-max-length": 100_000, "x-overflow": "drop-head"})
            await self._call(w, channel.queue_bind, queue=lost, exchange=lost, routing_key="")
        except BackendUnavailable as e:
            if "PRECONDITION_FAILED" not in str(e):
                raise
            log.warning("queue %s exists with other arguments (an older, unreplicated version): kept; delete it "
                        "(rabbitmqctl delete_queue %s) to have it declared replicated", lost, lost)
        finally:
            if channel.is_open:
                channel.close()

    def dead_letter_queue_arguments(self) -> dict[str, Any]:
        """The per-queue dead-letter queue keeps the broker's copy of each dead letter (the
        repository, dead_letters_v1, is what operators read; an undecodable message has only this
        copy), bounded: the oldest copies go first past ``dead_letter_max`` or ``dead_letter_keep_s``,
        so a queue that dead-letters for weeks cannot fill the broker's disk and block publishers."""
        s = self._settings
        return {**self._queue_type(), "x-max-length": s.dead_letter_max, "x-overflow": "drop-head",
                "x-message-ttl": s.dead_letter_keep_s * 1000}

    async def _declare_dead_letter_queue(self, queue: str, dlx: str) -> None:
        """The queue's dead-letter exchange and its bounded queue. One left by an older version
        (unbounded, or with other bounds) is kept, and the log says how to bound it."""
        dlq = names.dead_letter_queue(queue)
        channel, w = await self._channel()
        try:
            await self._call(w, channel.exchange_declare, exchange=dlx, exchange_type="fanout", durable=True)
            await self._call(w, channel.queue_declare, queue=dlq, durable=True, arguments=self.dead_letter_queue_arguments())
        except BackendUnavailable as e:
            if "PRECONDITION_FAILED" not in str(e):
                raise
            s = self._settings
            log.warning("dead-letter queue %s exists with other arguments (an older version: unbounded): kept; bound it "
                        "with a policy: rabbitmqctl set_policy --apply-to queues mailqueue-dead-letters "
                        "'^mailqueue\\..*\\.dead-letter$' '{\"max-length\":%d,\"overflow\":\"drop-head\",\"message-ttl\":%d}'",
                        dlq, s.dead_letter_max, s.dead_letter_keep_s * 1000, extra={"queue": queue})
        finally:
            if channel.is_open:
                channel.close()
        channel, w = await self._channel()
        try:
            await self._call(w, channel.queue_bind, queue=dlq, exchange=dlx, routing_key="")
        finally:
            if channel.is_open:
                channel.close()

    async def declare_queue(self, queue: str) -> None:
        if queue in self._declared:
            return
        if not self._may_configure:
            await self._await_declared([names.work_queue(queue, p) for p in model.PRIORITIES])
            self._declared.add(queue)
            return
        try:
            await self._declare_queue(queue)
        except BackendUnavailable as e:
            if not self._refused(e):
                raise
            await self.declare_queue(queue)

    def _refused(self, e: BackendUnavailable) -> bool:
        """A declaration refused for want of the configure permission (dequeue_svc's user has none:
        it may not declare, so it may not delete either). From then on this broker only waits for
        the topology that enqueue_svc declares."""
        if "ACCESS_REFUSED" not in str(e):
            return False
        if self._may_configure:
            self._may_configure = False
            log.info("this RabbitMQ user may not declare (no configure permission): using the topology enqueue_svc declares")
        return True

    async def _await_declared(self, rabbit_queues: list[str]) -> None:
        """Wait until each queue exists (a passive declare needs no permission): a consumer that
        subscribes before the first mail of its queue waits for enqueue_svc to declare it."""
        for rabbit_queue in rabbit_queues:
            while not await self._exists(rabbit_queue):
                await asyncio.sleep(TOPOLOGY_POLL_S)

    async def _exists(self, rabbit_queue: str) -> bool:
        return await self._passive(rabbit_queue) is not None

    async def _passive(self, rabbit_queue: str) -> Any:
        """A passive declare (no permission needed): the broker's answer, None when the queue does not exist."""
        channel, w = await self._channel()
        try:
            return await self._call(w, channel.queue_declare, queue=rabbit_queue, passive=True)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e):
                return None
            raise
        finally:
            if channel.is_open:
                channel.close()

    async def _declare_queue(self, queue: str) -> None:
        await self._declare_ladder()
        dlx = names.dead_letter_exchange(queue)
        await self._declare_dead_letter_queue(queue, dlx)
        channel, w = await self._channel()
        try:
            await self._call(w, channel.queue_bind, queue=self._marks_queue, exchange=dlx, routing_key="")
            await self._call(w, channel.exchange_declare, exchange=names.exchange(queue), exchange_type="direct", durable=True)
            for priority in model.PRIORITIES:  # one work queue per delivery class
                work = names.work_queue(queue, priority)
                await self._call(w, channel.queue_declare, queue=work, durable=True, arguments=self.work_queue_arguments(queue))
                await self._call(w, channel.queue_bind, queue=work, exchange=names.exchange(queue),
                                 routing_key=names.priority_key(priority))
                await self._call(w, channel.queue_bind, queue=work, exchange=names.delay_delivery_exchange(),
                                 routing_key=delays.delivery_binding(queue, priority))
        finally:
            if channel.is_open:
                channel.close()
        self._declared.add(queue)

    async def publish(
        self, mail: model.QueuedMail, delay: dt.timedelta = dt.timedelta(0), counted: bool | None = None,
        content: bytes | None = None, reservation: tuple[int, int] | None = None,
    ) -> None:
        blocked = self._blocking.reason()
        if blocked is not None:
            raise PublishersBlocked(blocked)  # its confirm would wait for the alarm to be lifted
        queue = mail.queue
        await self.declare_queue(queue)
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
                self._declared.discard(queue)
                self._ladder_declared = False
            raise

    async def _confirmed(self, publisher: Publisher, confirmed: Awaitable[Any]) -> None:
        """Wait for ``confirmed`` (a publish's confirm, or a batch's); past ``confirm_timeout_s``,
        leave the node (hung, or cut off from its quorum) and raise BackendUnavailable."""
        try:
            await asyncio.wait_for(confirmed, self._settings.confirm_timeout_s)
        except asyncio.TimeoutError:
            conn = self._conn
            if conn is not None and publisher is self._publisher:
                log.warning("publish not confirmed; leaving this rabbitmq node", extra={"timeout_s": self._settings.confirm_timeout_s})
                self._leave(conn)
                self._abandon(conn)
            raise unavailable(f"publish not confirmed within {self._settings.confirm_timeout_s}s") from None

    async def publish_batch(self, exchange: str, routing_key: str, messages: Sequence[message_format.Encoded]) -> None:
        """Publish every message at once on the shared confirm channel (with the mails' publishes)
        and wait once for all their confirms: returns when the broker confirmed each; otherwise
        BackendUnavailable (PublishersBlocked while the broker blocks publishers)."""
        blocked = self._blocking.reason()
        if blocked is not None:
            raise PublishersBlocked(blocked)
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

    async def open_channel(self) -> tuple[Channel, Waiters]:
        """A new channel on this process's connection (its futures in the Waiters): the caller closes it."""
        return await self._channel()

    async def answer(self, waiters: Waiters, method: Callable[..., Any], **kwargs: Any) -> Any:
        """Call a channel method and wait for the broker's answer (BackendUnavailable if none in time)."""
        return await self._call(waiters, method, **kwargs)

    async def consume(self, queue: str, prefetch: int) -> RabbitMQConsumer:
        await self.declare_queue(queue)
        try:
            return await self._consume({p: names.work_queue(queue, p) for p in model.PRIORITIES}, prefetch)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e):
                self._declared.discard(queue)  # removed since it was declared here: declared again next time
            raise

    async def consume_dead_letters(self, prefetch: int) -> RabbitMQConsumer:
        if self._may_configure:
            try:
                await self._declare_ladder()
            except BackendUnavailable as e:
                if not self._refused(e):
                    raise
        if not self._may_configure:
            await self._await_declared([self._marks_queue])
        return await self._consume({"normal": self._marks_queue}, prefetch)

    async def _consume(self, rabbit_queues: dict[str, str], prefetch: int) -> RabbitMQConsumer:
        """One channel, one consumer per queue, each with ``prefetch`` (per-consumer QoS): delivery
        tags stay unique on the channel, and a busy class never takes another's credit."""
        channel, w = await self._channel()
        consumer = RabbitMQConsumer(channel, w)
        try:
            await self._call(w, channel.basic_qos, prefetch_count=prefetch)
            for priority, rabbit_queue in rabbit_queues.items():
                on_message = functools.partial(consumer.on_message, priority)
                fut = w.call(lambda callback, q=rabbit_queue, m=on_message: channel.basic_consume(q, m, auto_ack=False, callback=callback))
                await self._answer(fut, "basic.consume")
        except BaseException:
            # Failed or cancelled (a client that leaves while subscribing): a consumer nobody owns
            # would take up to ``prefetch`` messages and hold them unacked until the process ends.
            await consumer.close()
            raise
        return consumer

    async def delete_queue(self, queue: str) -> None:
        self._declared.discard(queue)
        channel, w = await self._channel()
        try:
            for priority in model.PRIORITIES:
                await self._call(w, channel.queue_delete, queue=names.work_queue(queue, priority))
            await self._call(w, channel.queue_delete, queue=names.dead_letter_queue(queue))
            await self._call(w, channel.exchange_delete, exchange=names.exchange(queue))
            await self._call(w, channel.exchange_delete, exchange=names.dead_letter_exchange(queue))
        finally:
            if channel.is_open:
                channel.close()
        self._declared.discard(queue)

    async def ready_messages(self, queue: str) -> int:
        return sum([await self._message_count(names.work_queue(queue, p)) for p in model.PRIORITIES])

    async def _message_count(self, rabbit_queue: str) -> int:
        """Ready messages of one RabbitMQ queue; 0 when it does not exist."""
        frame = await self._passive(rabbit_queue)
        return int(frame.method.message_count) if frame is not None else 0

    async def ping(self) -> None:
        await self._connection()

    def blocked(self) -> str | None:
        return self._blocking.reason()

    async def watch_alarms(self) -> None:
        await AlarmWatch(lambda: self._open(self._nodes[self._node]), self._blocking).run()

    async def close(self) -> None:
        if self._conn is not None and self._conn.is_open:
            self._conn.close()

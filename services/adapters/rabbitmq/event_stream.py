"""The event stream on a RabbitMQ stream queue (``x-queue-type: stream``, RabbitMQ 3.9+, AMQP 0.9.1).

One stream per view (keyspace), ``mailqueue._events.<keyspace>``, fed by a fanout exchange of the
same name (a publisher needs write access to it only: dequeue_svc's user may not declare, nor
write to the default exchange). The stream keeps events for ``event_stream_retention_s``
(``x-max-age``) and at most ``event_stream_max_bytes`` (``x-max-length-bytes``); RabbitMQ removes
whole segments (``x-stream-max-segment-size-bytes``, a tenth of the cap), oldest first.

- ``record(events)`` (a sink of the EventLog): the events of every ``record`` call that meet in
  one event-loop turn, and of those that arrive while a publish is out, leave together as one
  message (an EventBatch, protos/mailqueue/v1/events.proto; at most MAX_PER_MESSAGE events and
  about MESSAGE_BYTES), published on the broker's confirm channel with one wait for every
  confirm. The broker's cost is per message: a message per event cost it as much as the mail's
  own publish (a delivery's two events, twice that).
- ``watch(cursor)``: a consumer on a channel of its own, with a prefetch and manual acks (what a
  stream consumer needs), from ``x-stream-offset`` = the cursor's message, "first" or "next". Each
  event's cursor names its message's offset (the ``x-stream-offset`` header) and its place in it
  (services/domain/event_stream.py); the events before the cursor's, in its message, are skipped.
  A cursor's message must exist: the stream's last chunk is read first (a consumer from "last"),
  and a cursor past it is OutOfRange (RabbitMQ would attach at the end and the watch skip every
  event until the offsets reached the cursor's: a stream declared again starts at 0).
  The channel closes when the caller stops iterating (a client that leaves), so no consumer
  outlives its watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from google.protobuf.message import DecodeError
from prometheus_client import Counter

from mailqueue.v1 import events_pb2
from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.channels import unavailable
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.contract import events_serde
from services.domain import event_stream, names
from services.domain.errors import BackendUnavailable, OutOfRange, ResourceExhausted
from services.domain.events import Event

log = logging.getLogger(__name__)

#: What reached the stream, confirmed: messages, and the events they hold (their ratio: how well
#: the events of concurrent changes share a message; the broker's cost is per message).
PUBLISHED = Counter("mailqueue_event_stream_published_total", "Messages and events published to the event stream, confirmed",
                    ["unit"])

#: Messages (event batches) a watcher's consumer may hold unacknowledged (a stream consumer needs a
#: prefetch). Each is up to MESSAGE_BYTES (about 512 KiB): a watcher catching up, or one whose client
#: stopped reading, holds that many in memory; 100 was 50 MiB each (webhook_svc's endpoints: 8).
PREFETCH = 16
#: A message's type: an EventBatch; a message of the older type holds one Event.
BATCH_TYPE = "mailqueue.v1.EventBatch"
EVENT_TYPE = "mailqueue.v1.Event"
#: A stream message's body, about, at most (events are a few hundred bytes each).
MESSAGE_BYTES = 512 * 1024
#: A watch from a cursor first reads the stream's last chunk: this long without a message, once the
#: first came, means it was all read, and a cursor after it is past the end.
PROBE_IDLE_S = 2.0
#: A message of the stream whose events are all this much younger than the start of that read was
#: published after it (new traffic, not the last chunk): clocks of other hosts may be this far ahead.
PROBE_SKEW_S = 5.0


class RabbitMQEventStream:
    def __init__(self, broker: RabbitMQBroker, keyspace: str, settings: RabbitMQSettings, prefetch: int = PREFETCH) -> None:
        self._broker = broker
        self._settings = settings
        self.name = names.event_stream(keyspace)
        self._prefetch = prefetch
        self._declared = False
        #: False once a declaration was refused (dequeue_svc's user may not configure).
        self._may_configure = True
        #: The record calls whose events wait for the next publish, and the task publishing.
        self._waiting: list[tuple[Sequence[Event], Sequence[bytes], asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None
        #: Watches being served (each holds a channel): at most ``settings.event_watchers_max``.
        self._watching = 0

    def arguments(self) -> dict[str, Any]:
        """The stream's declaration: its retention by age and by size, in segments of a tenth of the size."""
        s = self._settings
        return {"x-queue-type": "stream", "x-max-age": f"{s.event_stream_retention_s}s",
                "x-max-length-bytes": s.event_stream_max_bytes,
                "x-stream-max-segment-size-bytes": max(1024**2, min(500 * 1024**2, s.event_stream_max_bytes // 10))}

    async def declare(self) -> None:
        """Declare the exchange, the stream and their binding (idempotent). A user without the
        configure permission (dequeue_svc's) declares nothing: it checks that the exchange exists
        (BackendUnavailable until browse_svc, or enqueue_svc, declared it)."""
        if self._declared:
            return
        if not self._may_configure:
            await self._await_exchange()
            self._declared = True
            return
        channel, w = await self._broker.open_channel()
        try:
            await self._broker.answer(w, channel.exchange_declare, exchange=self.name, exchange_type="fanout", durable=True)
            await self._broker.answer(w, channel.queue_declare, queue=self.name, durable=True, arguments=self.arguments())
            await self._broker.answer(w, channel.queue_bind, queue=self.name, exchange=self.name, routing_key="")
        except BackendUnavailable as e:
            if "ACCESS_REFUSED" in str(e):
                if self._may_configure:
                    log.info("this RabbitMQ user may not declare the event stream %s: browse_svc declares it", self.name)
                self._may_configure = False
            else:
                if "PRECONDITION_FAILED" in str(e):
                    log.error("the event stream %s exists with other arguments: kept as it is; to apply the settings, "
                              "set a policy (rabbitmqctl set_policy --apply-to queues ... max-age/max-length-bytes)", self.name)
                    self._declared = True
                    return
                raise
        finally:
            if channel.is_open:
                channel.close()
        if not self._may_configure:
            await self._await_exchange()
        self._declared = True

    async def _await_exchange(self) -> None:
        """For a user that may not declare: the exchange must exist before anything is published
        to it (a publish to a missing exchange would close the confirm channel the mails share)."""
        channel, w = await self._broker.open_channel()
        try:
            await self._broker.answer(w, channel.exchange_declare, exchange=self.name, passive=True)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e):
                raise BackendUnavailable("rabbitmq", f"the event stream {self.name} is not declared yet: browse_svc "
                                         "declares it at start-up (this service's user may not)") from e
            raise
        finally:
            if channel.is_open:
                channel.close()

    async def publish(self, events: Sequence[Event], encoded: Sequence[bytes] | None = None) -> None:
        """Returns once the broker confirmed every event; BackendUnavailable (PublishersBlocked
        while the broker blocks publishers) otherwise, and a retry publishes the same event ids.
        ``encoded``: the events already serialized (events_serde.encode_each), in order."""
        await self.declare()
        if encoded is None:
            encoded = events_serde.encode_each(events)
        messages = [message_format.Encoded(events_serde.batch_of_encoded(encoded[first:end]), {}, events[first].id, type=BATCH_TYPE)
                    for first, end in _cut(encoded)]
        try:
            await self._broker.publish_batch(self.name, "", messages)
            PUBLISHED.labels("messages").inc(len(messages))
            PUBLISHED.labels("events").inc(len(events))
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e) or "unroutable" in str(e):
                self._declared = False  # removed since (an operator, a reset): declared again next time
            raise

    async def record(self, events: Sequence[Event], encoded: Sequence[bytes] | None = None) -> None:
        """As a sink of the event log (services/adapters/cassandra/event_log.py): published with
        the events of the other callers that meet it (see the module's docstring); returns once
        the broker confirmed them, BackendUnavailable otherwise."""
        if not events:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.add_done_callback(_retrieved)
        self._waiting.append((events, encoded or events_serde.encode_each(events), done))
        if self._sending is None:
            self._sending = loop.create_task(self._send())
        await done  # a cancelled caller cancels its own answer, never the publish others wait for

    async def _send(self) -> None:
        """Publish what waits, one group after the other, until nothing does."""
        try:
            await asyncio.sleep(0)  # the callers of this loop turn join the first group
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    await self.publish([e for events, _, _ in group for e in events],
                                       [b for _, encoded, _ in group for b in encoded])
                except Exception as e:  # noqa: BLE001 - every caller of the group gets the failure
                    for _, _, done in group:
                        if not done.done():
                            done.set_exception(e)
                except BaseException:  # cancelled (the service stops): no caller waits for ever
                    for _, _, done in (*group, *self._waiting):
                        done.cancel()
                    self._waiting = []
                    raise
                else:
                    for _, _, done in group:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._sending = None

    async def watch(self, cursor: str | None, from_oldest: bool = False) -> AsyncIterator[Event]:
        """Events from ``cursor`` (that event first), or from the oldest kept, or from the next one
        recorded; InvalidArgument for a malformed cursor before anything is read, OutOfRange for
        one past the stream's last message (``_holds``)."""
        begin = event_stream.start(cursor or "", from_oldest)
        if self._watching >= self._settings.event_watchers_max:
            raise ResourceExhausted(f"this process serves {self._watching} event watchers, its most "
                                    "(MAILQUEUE_EVENT_WATCHERS_MAX): try again later, or on another replica")
        self._watching += 1
        try:
            async with contextlib.aclosing(self._watch(begin)) as events:  # its channel closed when the caller leaves
                async for event in events:
                    yield event
        finally:
            self._watching -= 1

    async def _watch(self, begin: event_stream.Start) -> AsyncIterator[Event]:
        await self.declare()
        if isinstance(begin.offset, int) and not await self._holds(begin.offset):
            # RabbitMQ would attach such a consumer at the end and this watch would skip, silently,
            # every event until the stream's offsets reach the cursor's: a stream deleted and
            # declared again (a broker reset) starts at offset 0 again.
            raise OutOfRange(
                f"the cursor is past the end of the event stream {self.name}: it was given by a stream since deleted "
                "and declared again (a broker reset), or by another stream; watch again with from_oldest (the oldest "
                "event kept) or with no cursor (from now on)")
        async with contextlib.aclosing(self._messages(begin.offset)) as messages:
            async for props, body in messages:
                for event in self._events(props, body, begin):
                    yield event

    async def _holds(self, offset: int) -> bool:
        """Whether the stream held a message at ``offset`` or after it when asked: its last chunk
        read (a consumer from "last": the first message within the connect timeout, none for an
        empty stream) until such a message (True), a message published since (False: the chunk
        is over, what follows is new traffic), or PROBE_IDLE_S without any (False)."""
        began = time.time()
        messages = self._messages("last", idle_s=PROBE_IDLE_S, first_s=self._settings.connect_timeout_s)
        async with contextlib.aclosing(messages):
            async for props, body in messages:
                if _newest(props, body) >= began + PROBE_SKEW_S:
                    return False
                if _offset(props) >= offset:
                    return True
        return False

    async def _messages(
        self, offset: int | str, idle_s: float | None = None, first_s: float | None = None,
    ) -> AsyncIterator[tuple[Any, bytes]]:
        """The stream's messages from ``offset`` (a number, "first", "next" or "last"), properties
        and body, on a consumer of a channel of its own, closed when the caller stops iterating;
        with ``idle_s``, they end after that long without one (``first_s`` for the first one)."""
        channel, w = await self._broker.open_channel()
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        channel.add_on_close_callback(lambda _ch, reason: inbox.put_nowait(unavailable(reason)))
        channel.add_on_cancel_callback(lambda _f: inbox.put_nowait(unavailable(f"the broker cancelled the consumer of {self.name}")))
        try:
            await self._broker.answer(w, channel.basic_qos, prefetch_count=self._prefetch)
            fut = w.call(lambda callback: channel.basic_consume(
                self.name, lambda _ch, method, props, body: inbox.put_nowait((method.delivery_tag, props, body)),
                auto_ack=False, arguments={"x-stream-offset": offset}, callback=callback))
            async with asyncio.timeout(self._settings.connect_timeout_s):
                await fut
            unacked, wait = 0, first_s if first_s is not None else idle_s
            while True:
                try:
                    async with asyncio.timeout(wait):
                        item = await inbox.get()
                except TimeoutError:
                    if idle_s is None:
                        raise
                    return
                if isinstance(item, BackendUnavailable):
                    raise item
                tag, props, body = item
                unacked, wait = unacked + 1, idle_s
                if unacked >= self._prefetch // 2:  # credit back in halves: the broker keeps sending
                    channel.basic_ack(tag, multiple=True)
                    unacked = 0
                yield props, body
        except TimeoutError:
            raise unavailable(f"no answer to basic.consume on {self.name} within {self._settings.connect_timeout_s}s") from None
        finally:
            if channel.is_open:
                channel.close()

    def _events(self, props: Any, body: bytes, begin: event_stream.Start) -> list[Event]:
        """The events of one message at or after ``begin``, each with its cursor (a message that
        holds no events: logged and skipped)."""
        offset = (props.headers or {}).get("x-stream-offset")
        try:
            at = int(offset)
            if props.type == EVENT_TYPE:  # one event per message, as written before EventBatch
                pbs = [events_pb2.Event.FromString(body)]
            else:
                pbs = events_serde.batch_from_bytes(body)
            return events_serde.readable(((event_stream.cursor_of(at, i), pb) for i, pb in enumerate(pbs) if begin.wants(at, i)),
                                         _unreadable)
        except (DecodeError, ValueError, TypeError) as e:
            log.warning("skipped a message of the event stream that is not an event", extra={"stream": self.name, "offset": offset,
                                                                                           "error": str(e)[:200]})
            return []


def _offset(props: Any) -> int:
    """A stream message's offset (-1: none, not a message of a stream)."""
    try:
        return int((props.headers or {}).get("x-stream-offset"))
    except (TypeError, ValueError):
        return -1


def _newest(props: Any, body: bytes) -> float:
    """The time of a stream message's newest event, in seconds (0: none read): the message was
    published after it."""
    try:
        pbs = [events_pb2.Event.FromString(body)] if props.type == EVENT_TYPE else events_serde.batch_from_bytes(body)
    except (DecodeError, ValueError, TypeError):
        return 0.0
    return max((pb.time.seconds + pb.time.nanos / 1e9 for pb in pbs), default=0.0)


def _cut(encoded: Sequence[bytes]) -> list[tuple[int, int]]:
    """Encoded events in order, cut into messages of at most MAX_PER_MESSAGE events and about
    MESSAGE_BYTES: each message's (first, end) indexes."""
    parts: list[tuple[int, int]] = []
    first, size = 0, 0
    for i, body in enumerate(encoded):
        weight = len(body) + 4  # and its tag and length in the EventBatch
        if i > first and (i - first >= event_stream.MAX_PER_MESSAGE or size + weight > MESSAGE_BYTES):
            parts.append((first, i))
            first, size = i, 0
        size += weight
    if first < len(encoded):
        parts.append((first, len(encoded)))
    return parts


#: The event types this process could not read, said once each.
_said: set[int] = set()


def _unreadable(pb: events_pb2.Event, e: ValueError) -> None:
    """An event this version cannot read (a type a newer version added): skipped, the others sent."""
    if pb.type not in _said:
        _said.add(pb.type)
        log.warning("skipped events this version cannot read", extra={"type": pb.type, "error": str(e)[:200]})


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()

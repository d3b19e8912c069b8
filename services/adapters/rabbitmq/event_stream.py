"""The event stream on a RabbitMQ stream queue (``x-queue-type: stream``, RabbitMQ 3.9+, AMQP 0.9.1).

One stream per view (keyspace), ``mailqueue._events.<keyspace>``, fed by a fanout exchange of the
same name (a publisher needs write access to it only: dequeue_svc's user may not declare, nor
write to the default exchange). The stream keeps events for ``event_stream_retention_s``
(``x-max-age``) and at most ``event_stream_max_bytes`` (``x-max-length-bytes``); RabbitMQ removes
whole segments (``x-stream-max-segment-size-bytes``, a tenth of the cap), oldest first.

- ``publish(events)`` (a sink of the EventLog): every event is a message (body: the serialized
  mailqueue.v1.Event, message_id: the event id), all published at once on the broker's confirm
  channel, with one wait for every confirm: never a round trip per event.
- ``watch(cursor)``: a consumer on a channel of its own, with a prefetch and manual acks (what a
  stream consumer needs), from ``x-stream-offset`` = the cursor's offset, "first" or "next". Each
  event's cursor is its message's offset (the ``x-stream-offset`` header). The channel closes when
  the caller stops iterating (a client that leaves), so no consumer outlives its watcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.channels import unavailable
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.contract import events_serde
from services.domain import event_stream, names
from services.domain.errors import BackendUnavailable
from services.domain.events import Event

log = logging.getLogger(__name__)

#: Events a watcher's consumer may hold unacknowledged (a stream consumer needs a prefetch).
PREFETCH = 500
EVENT_TYPE = "mailqueue.v1.Event"


class RabbitMQEventStream:
    def __init__(self, broker: RabbitMQBroker, keyspace: str, settings: RabbitMQSettings, prefetch: int = PREFETCH) -> None:
        self._broker = broker
        self._settings = settings
        self.name = names.event_stream(keyspace)
        self._prefetch = prefetch
        self._declared = False
        #: False once a declaration was refused (dequeue_svc's user may not configure).
        self._may_configure = True

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

    async def publish(self, events: Sequence[Event]) -> None:
        """Returns once the broker confirmed every event; BackendUnavailable (PublishersBlocked
        while the broker blocks publishers) otherwise, and a retry publishes the same event ids."""
        await self.declare()
        messages = [message_format.Encoded(events_serde.event_to_bytes(e), {}, e.id, type=EVENT_TYPE) for e in events]
        try:
            await self._broker.publish_batch(self.name, "", messages)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e) or "unroutable" in str(e):
                self._declared = False  # removed since (an operator, a reset): declared again next time
            raise

    async def record(self, events: Sequence[Event]) -> None:
        """As a sink of the event log (services/adapters/cassandra/event_log.py): ``publish``."""
        await self.publish(events)

    async def watch(self, cursor: str | None, from_oldest: bool = False) -> AsyncIterator[Event]:
        """Events from ``cursor`` (that event first), or from the oldest kept, or from the next one
        recorded; InvalidArgument for a malformed cursor before anything is read."""
        offset = event_stream.start(cursor or "", from_oldest)
        await self.declare()
        channel, w = await self._broker.open_channel()
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        channel.add_on_close_callback(lambda _ch, reason: inbox.put_nowait(unavailable(reason)))
        channel.add_on_cancel_callback(lambda _f: inbox.put_nowait(unavailable(f"the broker cancelled the consumer of {self.name}")))
        try:
            await self._broker.answer(w, channel.basic_qos, prefetch_count=self._prefetch)
            fut = w.call(lambda callback: channel.basic_consume(
                self.name, lambda _ch, method, props, body: inbox.put_nowait((method.delivery_tag, props, body)),
                auto_ack=False, arguments={"x-stream-offset": offset}, callback=callback))
            await asyncio.wait_for(fut, self._settings.connect_timeout_s)
            unacked = 0
            while True:
                item = await inbox.get()
                if isinstance(item, BackendUnavailable):
                    raise item
                tag, props, body = item
                unacked += 1
                if unacked >= self._prefetch // 2:  # credit back in halves: the broker keeps sending
                    channel.basic_ack(tag, multiple=True)
                    unacked = 0
                event = self._event(props, body)
                if event is not None:
                    yield event
        except asyncio.TimeoutError:
            raise unavailable(f"no answer to basic.consume on {self.name} within {self._settings.connect_timeout_s}s") from None
        finally:
            if channel.is_open:
                channel.close()

    def _event(self, props: Any, body: bytes) -> Event | None:
        offset = (props.headers or {}).get("x-stream-offset")
        try:
            return events_serde.event_from_bytes(body, event_stream.cursor_of(int(offset)))
        except (DecodeError, ValueError, TypeError) as e:
            log.warning("skipped a message of the event stream that is not an event", extra={"stream": self.name, "offset": offset,
                                                                                           "error": str(e)[:200]})
            return None

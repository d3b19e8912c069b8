"""Dequeue (DESIGN §4): RabbitMQ deliveries -> live mails with content -> outcomes.

- A delivery whose mail is deleted, or whose slice was swept (before content start), is acked
  and skipped without fetching content.
- SUCCESS marks the mail deleted **then** acks: a crash between the two redelivers a mail that
  is then skipped. No loss, no ghost.
- RETRY requeues, except on the last delivery the broker allows (quorum queues' delivery limit):
  that one is dead-lettered here and marked, as the broker would dead-letter it unmarked;
  REJECT marks the mail dead-lettered and routes it to the dead-letter queue;
  an undecodable message or a missing blob is dead-lettered too.
- A transient Cassandra or blob store error keeps the delivery with its consumer, retried with a
  growing pause (never lost, never dead-lettered: a requeue would count towards the delivery limit).
- Closing a subscription (stream ended, client gone, process killed) returns its unacked
  deliveries to the queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging

from prometheus_client import Counter

from services import browse_start, model, serde, validation
from services.blobstore import BlobStore
from services.broker import Broker, Consumer, Message
from services.config import LimitSettings
from services.errors import BackendUnavailable, InvalidArgument, NotFound
from services.queue_state import QueueState
from services.view.view import View

log = logging.getLogger(__name__)

DELIVERED = Counter("mailqueue_delivered_total", "Deliveries handed to consumers", ["queue"])
OUTCOMES = Counter("mailqueue_outcomes_total", "Consumer outcomes", ["queue", "outcome"])
SKIPPED = Counter("mailqueue_skipped_total", "Deliveries acked without handing them out", ["queue", "reason"])
RETRIED_ON_ERROR = Counter(
    "mailqueue_delivery_retries_on_error_total",
    "Delivery preparations retried after a Cassandra or blob store error (the delivery stays with its consumer)",
    ["queue"],
)

DEFAULT_PREFETCH = 16
#: Pause before retrying a delivery after a backend error, doubled on each failure up to the maximum.
ERROR_BACKOFF_S = 0.5
MAX_ERROR_BACKOFF_S = 15.0


def retries_exhausted(delivery_count: int, limit: int | None) -> bool:
    """True when a requeue would make the broker dead-letter the message (its delivery limit)."""
    return limit is not None and delivery_count >= limit


class Outcome(enum.Enum):
    SUCCESS = 1
    RETRY = 2
    REJECT = 3


@dataclasses.dataclass(frozen=True)
class Delivery:
    tag: int
    mail: model.QueuedMail
    content: bytes | None  # None when the mail is larger than the inline threshold
    redelivered: bool
    delivery_count: int = 0


class Subscription:
    """One consumer's view of a queue.

    Deliveries are prepared (deleted check, content fetch) concurrently, up to the prefetch,
    and handed out in the order RabbitMQ delivered them.
    """

    def __init__(self, dequeuer: Dequeuer, queue: str, consumer: Consumer) -> None:
        self._d = dequeuer
        self.queue = queue
        self._consumer = consumer
        self._pending: dict[int, Delivery] = {}
        self._prepared: asyncio.Queue[asyncio.Future[Delivery | None]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    async def _pump_messages(self) -> None:
        try:
            while True:
                message = await self._consumer.get()
                await self._prepared.put(asyncio.ensure_future(self._prepare(message)))
        except Exception as e:  # the channel died: the next call to next() raises it
            failed: asyncio.Future[Delivery | None] = asyncio.get_running_loop().create_future()
            failed.set_exception(e)
            self._prepared.put_nowait(failed)

    async def next(self) -> Delivery:
        """The next live mail (waits). Raises BackendUnavailable when the broker channel died."""
        if self._pump is None:
            self._pump = asyncio.create_task(self._pump_messages())
        while True:
            delivery = await (await self._prepared.get())
            if delivery is not None:
                self._pending[delivery.tag] = delivery
                DELIVERED.labels(self.queue).inc()
                return delivery

    async def _prepare(self, message: Message) -> Delivery | None:
        try:
            from mailqueue.v1 import mail_pb2

            mail = serde.queued_mail_from_proto(mail_pb2.QueuedMail.FromString(message.body))
        except Exception:  # noqa: BLE001 - any undecodable body is poison
            log.error("undecodable message dead-lettered", extra={"queue": self.queue, "message_id": message.message_id})
            await self._consumer.dead_letter(message.delivery_tag)
            SKIPPED.labels(self.queue, "undecodable").inc()
            return None
        delay = ERROR_BACKOFF_S
        while True:
            try:
                return await self._checked(message, mail)
            except BackendUnavailable as e:
                # Kept, not requeued: on a quorum queue every requeue counts towards the delivery
                # limit, and an outage of a few seconds would dead-letter every mail in flight.
                log.warning("backend error: delivery retried in %.1f s: %s", delay, e, extra={"queue": self.queue})
                RETRIED_ON_ERROR.labels(self.queue).inc()
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_ERROR_BACKOFF_S)

    async def _checked(self, message: Message, mail: model.QueuedMail) -> Delivery | None:
        """The delivery of a live mail with its content; None when skipped or dead-lettered.

        Raises BackendUnavailable when Cassandra or the blob store does not answer.
        """
        try:
            if await self._d.view.deleted.reason(self.queue, mail.enqueue_id) is not None:
                await self._skip(message, "deleted")
                return None
            if await self._d.state.is_swept(self.queue, mail.slice_start):
                await self._skip(message, "swept")
                return None
            content = None
            if mail.size <= self._d.limits.dequeue_inline_bytes:
                content = await self._d.blobs.read(mail.blob_ids)
            else:
                for blob_id in mail.blob_ids:
                    await self._d.blobs.stat(blob_id)
        except NotFound:
            log.error("mail content missing: dead-lettered", extra={"queue": self.queue, "enqueue_id": str(mail.enqueue_id)})
            await self._d.view.deleted.mark(self.queue, mail.enqueue_id, "dead-lettered: content missing")
            await self._consumer.dead_letter(message.delivery_tag)
            SKIPPED.labels(self.queue, "content-missing").inc()
            return None
        return Delivery(message.delivery_tag, mail, content, message.redelivered, message.delivery_count)

    async def _skip(self, message: Message, reason: str) -> None:
        await self._consumer.ack(message.delivery_tag)
        SKIPPED.labels(self.queue, reason).inc()

    async def settle(self, tag: int, outcome: Outcome, error_message: str = "") -> None:
        delivery = self._pending.pop(tag, None)  # taken first: a second answer for the tag is refused
        if delivery is None:
            raise InvalidArgument(f"delivery tag {tag} is not an unanswered delivery of this stream")
        mail = delivery.mail
        if outcome is Outcome.SUCCESS:
            await self._d.mark_deleted(mail, "dequeued")
            await self._consumer.ack(tag)
        elif outcome is Outcome.RETRY and retries_exhausted(delivery.delivery_count, self._d.broker.delivery_limit):
            await self._dead_letter_at_limit(delivery, f": {error_message}" if error_message else "")
        elif outcome is Outcome.RETRY:
            await self._consumer.requeue(tag)
        else:
            reason = f"dead-lettered: {error_message}" if error_message else "dead-lettered"
            await self._d.mark_deleted(mail, reason[:1000])
            await self._consumer.dead_letter(tag)
        OUTCOMES.labels(self.queue, outcome.name).inc()

    async def close(self) -> None:
        """Stop consuming; unanswered deliveries return to the queue.

        Except those on the last delivery the broker allows: returned, the broker would
        dead-letter them with their view rows still live, so they are marked and dead-lettered here.
        """
        if self._pump is not None:
            self._pump.cancel()
        unanswered = list(self._pending.values())
        while not self._prepared.empty():
            prepared = self._prepared.get_nowait()
            if prepared.done() and not prepared.cancelled() and prepared.exception() is None and prepared.result():
                unanswered.append(prepared.result())
            prepared.cancel()
        for d in unanswered:
            if retries_exhausted(d.delivery_count, self._d.broker.delivery_limit):
                try:
                    await self._dead_letter_at_limit(d, ", last delivery unanswered")
                except BackendUnavailable as e:
                    log.warning("could not dead-letter a delivery on its last attempt: %s", e, extra={"queue": self.queue})
        await self._consumer.close()

    async def _dead_letter_at_limit(self, d: Delivery, detail: str) -> None:
        """Mark and dead-letter a delivery that the broker would dead-letter unmarked if it came back."""
        log.warning("delivery limit reached: dead-lettered", extra={"queue": self.queue, "enqueue_id": str(d.mail.enqueue_id)})
        reason = f"dead-lettered: delivery limit of {self._d.broker.delivery_limit} reached{detail}"
        await self._d.mark_deleted(d.mail, reason[:1000])
        await self._consumer.dead_letter(d.tag)


class Dequeuer:
    def __init__(self, view: View, broker: Broker, blobs: BlobStore, limits: LimitSettings, state: QueueState) -> None:
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.limits = limits
        self.state = state
        self._background: set[asyncio.Task[None]] = set()
        self._updating: set[str] = set()  # queues whose browse start update is running here

    async def subscribe(self, queue: str, prefetch: int) -> Subscription:
        validation.queue_name(queue)
        if prefetch > self.limits.max_prefetch:
            raise InvalidArgument(f"prefetch {prefetch} is over the maximum of {self.limits.max_prefetch}")
        await self.state.require_queue(queue)
        consumer = await self.broker.consume(queue, prefetch or DEFAULT_PREFETCH)
        return Subscription(self, queue, consumer)

    async def mark_deleted(self, mail: model.QueuedMail, reason: str) -> None:
        await self.view.deleted.mark(mail.queue, mail.enqueue_id, reason)
        config = await self.state.config()
        if mail.queue not in self._updating and browse_start.should_update(config.update_browse_start_pace):
            self._updating.add(mail.queue)
            task = asyncio.create_task(self._update_browse_start(mail.queue))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _update_browse_start(self, queue: str) -> None:
        try:
            await browse_start.update(self.view, queue)
        except BackendUnavailable as e:
            log.warning("browse start update skipped: %s", e, extra={"queue": queue})
        finally:
            self._updating.discard(queue)

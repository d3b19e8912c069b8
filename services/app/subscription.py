"""One consumer's stream (DESIGN §4): RabbitMQ deliveries -> live mails with content -> outcomes.

- A delivery whose mail is deleted, or whose slice was swept (before content start), is acked
  and skipped without fetching content.
- SUCCESS marks the mail deleted **then** acks: a crash between the two redelivers a mail that
  is then skipped. No loss, no ghost.
- A delivery older than the mail's schedule (a RETRY or a Flush published a newer one) is acked
  and skipped; one that arrives before its deliver_at (a skewed clock) goes back to the delay
  ladder for the rest of its wait.
- One mail is in flight at most once per process: a second copy (RepublishNotProcessed) that
  arrives while the first is being prepared or is handed out is acked and skipped, unless it
  is a newer generation (services/domain/in_flight.py).
- RETRY counts an attempt and publishes the mail again with its backoff (services/domain/schedule.py),
  then records the new schedule, then acks: it never spends the broker's delivery limit. A RETRY
  past the queue's retry policy expires the mail: marked and dead-lettered.
  REJECT marks the mail dead-lettered and routes it to the dead-letter queue;
  an undecodable message or a missing blob is dead-lettered too.
- A transient Cassandra or blob store error keeps the delivery with its consumer, retried with a
  growing pause (never lost, never dead-lettered: a requeue would count towards the delivery limit).
- A mail whose destination has no room (services/app/shaper.py) is published again to wait for
  its slot and acked, before its content is read: no attempt or delivery count spent.
- Closing a subscription (stream ended, client gone) publishes again the deliveries it received
  but never handed to the client, then acks them: a client that subscribes and leaves spends no
  delivery attempt. Handed-out, unanswered deliveries go back to the queue (one attempt each).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import enum
import logging
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter

from services.app import counters, verdict
from services.app.retry import retrying
from services.app.shaper import Wait
from services.app.verdict import Action
from services.domain import counts, delays, model, rules, schedule
from services.domain.backoff import Backoff
from services.domain.errors import BackendUnavailable, InvalidArgument
from services.domain.in_flight import InFlight
from services.ports.broker import Consumer, Message

if TYPE_CHECKING:
    from services.app.queue_state import QueueState
    from services.app.rule_book import RuleBook
    from services.app.shaper import Shaper
    from services.domain.settings import LimitSettings
    from services.ports.blobstore import BlobStore
    from services.ports.broker import Broker
    from services.ports.view import View


class DequeueSide(Protocol):
    """What a subscription uses of the dequeue side of its process (services/app/dequeuer.py)."""

    view: View
    broker: Broker
    blobs: BlobStore
    limits: LimitSettings
    state: QueueState
    rules: RuleBook
    shaper: Shaper
    #: (queue, enqueue id) of every mail being prepared or handed out by this process.
    in_flight: InFlight

    def carry(self, mail: model.QueuedMail, content: bytes | None) -> bytes | None: ...

    async def mark_deleted(self, mail: model.QueuedMail, reason: str) -> None: ...

log = logging.getLogger(__name__)

DELIVERED = Counter("mailqueue_delivered_total", "Deliveries handed to consumers", ["queue"])
OUTCOMES = Counter("mailqueue_outcomes_total", "Consumer outcomes", ["queue", "outcome"])
SKIPPED = Counter("mailqueue_skipped_total", "Deliveries acked without handing them out", ["queue", "reason"])
EXPIRED = Counter("mailqueue_expired_total", "Mails expired by their queue's retry policy", ["queue"])
RETURNED_UNSENT = Counter(
    "mailqueue_returned_unsent_total", "Deliveries a closing stream never handed out, published again without spending an attempt", ["queue"],
)
INLINE_CONTENT = Counter(
    "mailqueue_delivery_content_total",
    "Contents handed out inline, by where they came from (message: carried by a small mail's message; blob_store: read)",
    ["queue", "source"],
)
RETRIED_ON_ERROR = Counter(
    "mailqueue_delivery_retries_on_error_total",
    "Delivery preparations retried after a Cassandra or blob store error (the delivery stays with its consumer)",
    ["queue"],
)

DEFAULT_PREFETCH = 16
#: A waiting lower class gets at least one delivery in this many.
FAIRNESS = 10
#: Pause before retrying a delivery after a backend error, doubled on each failure up to the maximum.
#: A delivery whose preparation met a backend error is retried where it is, until it succeeds.
PREPARE_BACKOFF = Backoff("delivery preparation", initial_s=0.5, multiplier=2, max_s=15.0)


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
    #: Room taken at a shaped destination (given back when answered).
    ticket: object = None


class Subscription:
    """One consumer's view of a queue.

    Deliveries are prepared (deleted check, content fetch) concurrently, and handed out while the
    client has fewer than ``prefetch`` unanswered: the highest class first (high, normal, low),
    each class in the order RabbitMQ delivered it. A lower class that waits gets one delivery in
    ``FAIRNESS`` at the least, so it is never starved.
    """

    def __init__(
        self, dequeuer: DequeueSide, queue: str, consumer: Consumer, prefetch: int = DEFAULT_PREFETCH, max_batch: int = 1,
    ) -> None:
        self._d = dequeuer
        self.queue = queue
        self._consumer = consumer
        self._prefetch = prefetch
        #: Deliveries handed out together at most (``next`` then ``ready``).
        self.max_batch = max_batch
        self._pending: dict[int, Delivery] = {}
        self._classes: dict[str, collections.deque[asyncio.Future[Delivery | None]]] = {
            p: collections.deque() for p in model.PRIORITIES}
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None
        self._passed = 0  # deliveries in a row that went to a higher class while a lower one waited
        self._pump: asyncio.Task[None] | None = None
        #: Received from the broker, not yet handed to the client nor settled otherwise.
        self._unsent: dict[int, Message] = {}
        self._preparing: set[asyncio.Future[Delivery | None]] = set()
        #: Tags whose arrival already ended their counted delay (a retried preparation must not again).
        self._arrived: set[int] = set()

    async def _pump_messages(self) -> None:
        try:
            while True:
                message = await self._consumer.get()
                self._unsent[message.delivery_tag] = message
                task = asyncio.ensure_future(self._prepare(message))
                self._preparing.add(task)
                task.add_done_callback(self._preparing.discard)
                task.add_done_callback(lambda _t: self._changed.set())
                self._classes[message.priority if message.priority in self._classes else "normal"].append(task)
        except Exception as e:  # the channel died: the next call to next() raises it
            self._failure = e
            self._changed.set()

    def _pick(self) -> asyncio.Future[Delivery | None] | None:
        """The prepared delivery to hand out next, by class; None when none is prepared."""
        ready = [p for p, tasks in self._classes.items() if tasks and tasks[0].done()]
        if not ready:
            return None
        chosen = ready[-1] if len(ready) > 1 and self._passed >= FAIRNESS - 1 else ready[0]
        self._passed = self._passed + 1 if len(ready) > 1 and chosen == ready[0] else 0
        return self._classes[chosen].popleft()

    async def next(self) -> Delivery:
        """The next live mail (waits for one, and for the client's credit). Raises
        BackendUnavailable when the broker channel died."""
        if self._pump is None:
            self._pump = asyncio.create_task(self._pump_messages())
        while True:
            ready = self.ready(1)
            if ready:
                return ready[0]
            if self._failure is not None:
                raise self._failure
            self._changed.clear()
            await self._changed.wait()

    def ready(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` prepared deliveries the client has credit for, handed out now (no wait)."""
        out: list[Delivery] = []
        while len(out) < limit and len(self._pending) < self._prefetch:
            picked = self._pick()
            if picked is None:
                break
            delivery = picked.result()
            if delivery is None:
                continue
            self._unsent.pop(delivery.tag, None)
            self._pending[delivery.tag] = delivery
            DELIVERED.labels(self.queue).inc()
            out.append(delivery)
        return out

    async def _prepare(self, message: Message) -> Delivery | None:
        try:
            mail = message.mail()
        except Exception:  # noqa: BLE001 - any undecodable body is poison
            log.error("undecodable message dead-lettered", extra={"queue": self.queue, "message_id": message.message_id})
            self._unsent.pop(message.delivery_tag, None)
            await self._consumer.dead_letter(message.delivery_tag)
            SKIPPED.labels(self.queue, "undecodable").inc()
            return None
        key, generation = (self.queue, mail.enqueue_id), mail.generation
        if not self._d.in_flight.claim(key, generation):
            await self._skip(message, "in-flight")  # a second copy, not newer: the one held settles the mail
            return None
        try:
            # Kept, not requeued: on a quorum queue every requeue counts towards the delivery
            # limit, and an outage of a few seconds would dead-letter every mail in flight.
            delivery = await retrying(
                lambda: self._checked(message, mail), PREPARE_BACKOFF, (BackendUnavailable,), log,
                extra={"queue": self.queue}, on_retry=lambda _e: RETRIED_ON_ERROR.labels(self.queue).inc(),
            )
        except BaseException:
            self._d.in_flight.release(key, generation)
            raise
        if delivery is None:
            self._d.in_flight.release(key, generation)
            self._arrived.discard(message.delivery_tag)
        return delivery

    async def _checked(self, message: Message, mail: model.QueuedMail) -> Delivery | None:
        """The delivery of a live mail with its content; None when skipped or dead-lettered.

        Raises BackendUnavailable when Cassandra or the blob store does not answer.
        """
        d = self._d
        # Shaped before any backend read (a mail that waits costs one publish and one ack), except
        # a counted delay's arrival: the verdict's state ends it in the counters first.
        early = d.shaper.active and not message.delayed
        admission = d.shaper.admit(self.queue, mail, message.reservation, model.utcnow()) if early else None
        if isinstance(admission, Wait):
            return await self._wait_for_room(message, mail, admission, verdict.carried(message, mail))
        try:
            v = await verdict.judge(d.view.mails, d.rules, d.state, d.blobs, d.limits.dequeue_inline_bytes, self.queue, message, mail)
        except BaseException:
            d.shaper.release(admission, handed_out=False)  # retried or cancelled: admitted again next time
            raise
        if v.action is not Action.DELIVER:
            d.shaper.release(admission, handed_out=False)
        if v.arrived:
            await self._end_delay(message, mail, v.state)
        if v.action is Action.DELIVER:
            if not early:
                admission = d.shaper.admit(self.queue, mail, message.reservation, model.utcnow())
                if isinstance(admission, Wait):
                    return await self._wait_for_room(message, mail, admission, d.carry(mail, v.content) or verdict.carried(message, mail))
            if v.source:
                INLINE_CONTENT.labels(self.queue, v.source).inc()
            # A retried mail comes back in a new message: it was delivered before all the same.
            return Delivery(message.delivery_tag, mail, v.content, message.redelivered or mail.attempts > 0,
                            message.delivery_count, admission)
        if v.action is Action.SKIP:
            await self._skip(message, v.reason)
        elif v.action is Action.WAIT:  # only a clock behind the publisher's (or a rounding) gets here
            await d.broker.publish(mail, v.early, counted=message.delayed, content=verdict.carried(message, mail))
            await self._skip(message, v.reason)
        elif v.action is Action.DEAD_LETTER:
            if v.mark is not None:
                log.error("mail content missing: dead-lettered", extra={"queue": self.queue, "enqueue_id": str(mail.enqueue_id)})
                await counters.mark(d.view, mail, v.mark)
            await self._dead_letter(message, v.reason)
        else:
            assert v.rule is not None
            await self._apply(v.rule, message, mail)
        return None

    async def _wait_for_room(self, message: Message, mail: model.QueuedMail, wait: Wait, content: bytes | None) -> None:
        """Not handed out now: the mail waits in the delay ladder for room at its destination."""
        await self._d.broker.publish(mail, wait.delay, counted=False, content=content, reservation=wait.reservation)
        await self._skip(message, "shaped")

    async def _end_delay(self, message: Message, mail: model.QueuedMail, state: model.MailState | None) -> None:
        """Its delay (or hold) ends now. A redelivered message (returned by a stream that ended)
        was counted on its first arrival; one a killed process never prepared was not: drift
        that ReconcileCounters heals."""
        if not message.delayed or message.redelivered or message.delivery_tag in self._arrived:
            return
        self._arrived.add(message.delivery_tag)
        was_held = state is not None and counts.is_held(state)
        await counters.bump(self._d.view, mail, delayed=-1, held=-1 if was_held else 0)
        if was_held:  # no longer held, whether or not a rule holds it again
            await self._d.view.mails.reschedule(dataclasses.replace(mail, held_by=counts.NOT_HELD))

    async def _apply(self, rule: model.Rule, message: Message, mail: model.QueuedMail) -> None:
        """Bounce (mark, dead-letter) or hold (re-schedule, record, ack) a delivery a rule matches."""
        if rule.kind == "bounce":
            await self._d.mark_deleted(mail, model.truncated(rules.bounce_reason(rule)))
            await self._dead_letter(message, "bounced")
            return
        now = model.utcnow()
        held = dataclasses.replace(mail, deliver_at=rules.hold_until(rule, now), generation=mail.generation + 1,
                                   held_by=rule.rule_id)
        await self._d.broker.publish(held, held.due() - now, content=verdict.carried(message, mail))
        await self._d.view.mails.reschedule(held)
        await counters.bump(self._d.view, held, delayed=1, held=1)
        await self._skip(message, "held")

    async def _dead_letter(self, message: Message, reason: str) -> None:
        self._unsent.pop(message.delivery_tag, None)
        await self._consumer.dead_letter(message.delivery_tag)
        SKIPPED.labels(self.queue, reason).inc()

    async def _skip(self, message: Message, reason: str) -> None:
        self._unsent.pop(message.delivery_tag, None)
        await self._consumer.ack(message.delivery_tag)
        SKIPPED.labels(self.queue, reason).inc()

    async def settle(
        self, tag: int, outcome: Outcome, error_message: str = "", retry_after: dt.timedelta | None = None,
    ) -> None:
        delivery = self._pending.pop(tag, None)  # taken first: a second answer for the tag is refused
        if delivery is None:
            raise InvalidArgument(f"delivery tag {tag} is not an unanswered delivery of this stream")
        self._changed.set()  # credit for one more delivery
        self._arrived.discard(tag)
        mail = delivery.mail
        try:
            if outcome is Outcome.SUCCESS:
                await self._d.mark_deleted(mail, "dequeued")
                await self._consumer.ack(tag)
            elif outcome is Outcome.RETRY:
                await self._retry(delivery, model.truncated(error_message), retry_after)
            else:
                reason = f"dead-lettered: {error_message}" if error_message else "dead-lettered"
                await self._d.mark_deleted(mail, model.truncated(reason))
                await self._consumer.dead_letter(tag)
        finally:
            self._d.in_flight.release((self.queue, mail.enqueue_id), mail.generation)
            self._d.shaper.release(delivery.ticket)  # type: ignore[arg-type]
        if outcome is Outcome.RETRY:
            self._d.shaper.observe_retry(mail, error_message)
        OUTCOMES.labels(self.queue, outcome.name).inc()

    async def _retry(self, d: Delivery, error: str, retry_after: dt.timedelta | None) -> None:
        """Count the attempt; publish the mail again with its backoff, record it, then ack.

        A crash before the record leaves two copies with one generation (a duplicate delivery at
        worst); after it, the redelivered original is older than the record and is skipped.
        """
        mail, now = d.mail, model.utcnow()
        attempts = mail.attempts + 1
        verdict = schedule.next_attempt(await self._d.state.retry_policy(self.queue), attempts, mail.enqueued_at, now, retry_after)
        if isinstance(verdict, schedule.Expired):
            log.info("mail expired", extra={"queue": self.queue, "enqueue_id": str(mail.enqueue_id), "reason": verdict.reason})
            reason = f"{verdict.reason}: {error}" if error else verdict.reason
            await self._d.mark_deleted(mail, model.truncated(reason))
            # Its last attempt recorded too: the dead letter shows it (services/app/dead_letters.py).
            await self._d.view.mails.reschedule(
                dataclasses.replace(mail, attempts=attempts, last_error=error, generation=mail.generation + 1))
            await self._consumer.dead_letter(d.tag)
            EXPIRED.labels(self.queue).inc()
            return
        again = dataclasses.replace(
            mail, deliver_at=verdict.deliver_at, attempts=attempts, last_error=error, generation=mail.generation + 1,
        )
        self._d.in_flight.release((self.queue, mail.enqueue_id), mail.generation)  # the new copy may come back at once
        await self._d.broker.publish(again, verdict.deliver_at - now, content=self._d.carry(mail, d.content))
        await self._d.view.mails.reschedule(again)
        await counters.bump(self._d.view, again, delayed=1 if delays.units(verdict.deliver_at - now) else 0)
        await self._consumer.ack(d.tag)

    async def close(self) -> None:
        """Stop consuming. Deliveries never handed to the client are published again and acked
        (they spend no delivery attempt); handed-out, unanswered ones return to the queue.

        Except those on the last delivery the broker allows: returned, the broker would
        dead-letter them with their view rows still live, so they are marked and dead-lettered here.

        The consumer's channel is closed whatever happens on the way: left open, the messages it
        holds unacked (and those the broker keeps sending it up to the prefetch) would stay with a
        consumer nobody reads, live in the view and in no queue, until the process ends.
        """
        try:
            await self._close()
        finally:
            await self._consumer.close()

    async def _close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        preparing = list(self._preparing)
        for task in preparing:
            task.cancel()
        await asyncio.gather(*preparing, return_exceptions=True)  # let them unwind before counting
        for tasks in self._classes.values():  # prepared, never handed out: their room is free again
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is None and task.result() is not None:
                    self._d.shaper.release(task.result().ticket)  # type: ignore[union-attr,arg-type]
        self._d.shaper.consuming(-1)
        for message in self._consumer.drain():
            self._unsent[message.delivery_tag] = message
        # None of them is in flight in this process any more, whether or not they can be returned
        # below: a key left behind would make this process drop the broker's redelivery of the
        # mail as a second copy (a channel that died with its node fails every return).
        for message in self._unsent.values():
            with contextlib.suppress(Exception):
                mail = message.mail()
                self._d.in_flight.release((self.queue, mail.enqueue_id), mail.generation)
        for d in self._pending.values():
            self._d.in_flight.release((self.queue, d.mail.enqueue_id), d.mail.generation)
            self._d.shaper.release(d.ticket)  # type: ignore[arg-type]
            if retries_exhausted(d.delivery_count, self._d.broker.delivery_limit):
                try:
                    await self._dead_letter_at_limit(d, ", last delivery unanswered")
                except BackendUnavailable as e:
                    log.warning("could not dead-letter a delivery on its last attempt: %s", e, extra={"queue": self.queue})
        try:
            await self._return_unsent()
        except BackendUnavailable as e:  # the channel is gone: the broker returns them by itself
            log.warning("unsent deliveries left to the broker: %s", e, extra={"queue": self.queue, "unsent": len(self._unsent)})

    async def _return_unsent(self) -> None:
        """Publish again, then ack, every delivery the client never saw (in broker order)."""
        for tag in sorted(self._unsent):
            message = self._unsent.pop(tag)
            try:
                mail = message.mail()
            except Exception:  # noqa: BLE001 - poison: as _prepare would
                await self._consumer.dead_letter(tag)
                continue
            self._d.in_flight.release((self.queue, mail.enqueue_id), mail.generation)
            # Its delay stays counted until the copy arrives, unless this arrival counted it already.
            await self._d.broker.publish(mail, counted=message.delayed and tag not in self._arrived,
                                         content=verdict.carried(message, mail))
            await self._consumer.ack(tag)
            RETURNED_UNSENT.labels(self.queue).inc()

    async def _dead_letter_at_limit(self, d: Delivery, detail: str) -> None:
        """Mark and dead-letter a delivery that the broker would dead-letter unmarked if it came back."""
        log.warning("delivery limit reached: dead-lettered", extra={"queue": self.queue, "enqueue_id": str(d.mail.enqueue_id)})
        reason = f"dead-lettered: delivery limit of {self._d.broker.delivery_limit} reached{detail}"
        await self._d.mark_deleted(d.mail, model.truncated(reason))
        await self._consumer.dead_letter(d.tag)

"""One consumer's stream (DESIGN §4): RabbitMQ deliveries -> live mails with content -> outcomes.

The path of one delivery, each step a module that reads alone:

1. here: the message arrives; it is decoded (undecodable: dead-lettered) and claimed
   (services/app/claims.py: a second copy of a mail held here, not newer, is acked and skipped);
2. its destination is asked for room once (services/app/shaper.py), and the verdict is read
   (services/app/verdict.py), retried with a growing pause while Cassandra or the blob store
   does not answer (the delivery stays with its consumer: a requeue would count towards the
   broker's delivery limit);
3. the verdict is carried out (services/app/actions.py): handed out, or ended here;
4. handed out by credit and class (services/domain/fairness.py), until the client half-closes;
5. answered (services/app/settlement.py), or given back when the stream closes
   (services/app/closing.py).

A step that changes anything (a verdict carried out, an answer settled) runs to its end once
begun: a stream that closes, or is cancelled, waits for it rather than cutting it in half (#47: a
RETRY cut between its publish and its ack left two copies of the mail, and both were delivered).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging

from prometheus_client import Counter

from services.app import actions, closing, settlement, verdict
from services.app.claims import Claim
from services.app.delivery import DEFAULT_PREFETCH, Delivery, DequeueSide, Outcome, Stream
from services.app.handouts import HandOuts
from services.app.retry import retrying
from services.app.shaper import Wait
from services.app.verdict import Action
from services.domain import delivery_tags, model
from services.domain import events as mail_events
from services.domain.backoff import Backoff
from services.domain.errors import BackendUnavailable, InvalidArgument
from services.domain.fairness import Scheduler
from services.ports.broker import Consumer, Message

__all__ = ["DEFAULT_PREFETCH", "Delivery", "Outcome", "Subscription"]

log = logging.getLogger(__name__)

DELIVERED = Counter("mailqueue_delivered_total", "Deliveries handed to consumers", ["queue"])
RETRIED_ON_ERROR = Counter(
    "mailqueue_delivery_retries_on_error_total",
    "Delivery preparations retried after a Cassandra or blob store error (the delivery stays with its consumer)",
    ["queue"],
)

#: Pause before retrying a delivery after a backend error, doubled on each failure up to the maximum.
#: A delivery whose preparation met a backend error is retried where it is, until it succeeds.
PREPARE_BACKOFF = Backoff("delivery preparation", initial_s=0.5, multiplier=2, max_s=15.0)

Preparing = asyncio.Future[Delivery | None]


def _prepared(task: Preparing) -> bool:
    return task.done()


class Subscription:
    """One consumer's view of a queue: deliveries are prepared concurrently as they arrive, and
    handed out by the scheduler's credit and classes (services/domain/fairness.py)."""

    def __init__(
        self, side: DequeueSide, queue: str, consumer: Consumer, prefetch: int = DEFAULT_PREFETCH, max_batch: int = 1,
    ) -> None:
        self._side = side
        self.queue = queue
        self._stream = Stream(queue, consumer, side)
        #: Deliveries handed out together at most (``next`` then ``ready``).
        self.max_batch = max_batch
        #: The prefix of the tags this stream's client sees (services/domain/delivery_tags.py).
        self.tag_prefix = delivery_tags.new_prefix()
        #: Unanswered deliveries at most (the client's credit).
        self.prefetch = prefetch
        self._scheduler: Scheduler[Preparing] = Scheduler(model.PRIORITIES, prefetch)
        #: Handed out, not answered yet, by delivery tag.
        self._unanswered: dict[int, Delivery] = {}
        #: The messages of deliveries handed out but not sent yet (``sent`` or ``unhand`` ends that).
        self._in_hand: dict[int, Message] = {}
        #: Handed out, then never sent (the stream ended first): they go back unsent.
        self._unhanded: list[Delivery] = []
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None
        self._pump: asyncio.Task[None] | None = None
        self._preparing: set[Preparing] = set()
        #: Steps that change something (verdicts carried out, answers settled): never cancelled.
        self._committing: set[asyncio.Future[object]] = set()
        #: The deliveries whose answers are being settled, by broker tag (their claims: ``_let_go``).
        self._settling: dict[int, Delivery] = {}
        #: False once the client half-closed: nothing more is handed out.
        self._handing_out = True
        #: The server is stopping (``finish``): the stream ends once every delivery handed out is answered.
        self._finishing = False
        #: Hand-out events held to be written with their answer's (services/app/handouts.py).
        self._handouts = HandOuts(side.events, side.handout_event_delay_s, queue)

    async def _pump_messages(self) -> None:
        try:
            while True:
                message = await self._stream.consumer.get()
                self._stream.unsent[message.delivery_tag] = message
                task = asyncio.ensure_future(self._prepare(message))
                self._preparing.add(task)
                task.add_done_callback(self._preparing.discard)
                task.add_done_callback(lambda _t: self._changed.set())
                self._scheduler.add(message.priority, task)
        except Exception as e:  # the channel died: the next call to next() raises it
            self._failure = e
            self._let_go()
            self._changed.set()

    def _let_go(self) -> None:
        """The channel died, and the broker gave every message it held back to the queue: another
        stream of this process may get them at once. The claims on their mails are released now,
        not when this stream closes (its handler may be stuck sending to a client that stopped
        reading), or that stream would ack each copy as a second one held here, and the mails
        would be left without a message (until the healer, 15 minutes on). So are those of the
        REJECTs being settled: one whose nack fails on the dead channel has its mail marked dead,
        and the copy that comes back must reach the dead-letter queue through the other stream,
        not be acked there as a second one. (A SUCCESS or a RETRY keeps its claim until its mark
        or record is written: a copy judged before it would be handed out beside it.) The
        preparations under way are cancelled: they let go of their claims as they unwind (one in
        a blob read or a retry held it for seconds)."""
        held = [*self._unanswered.values(), *self._unhanded, *self._settling.values()]
        held += [t.result() for t in self._scheduler.queued() if t.done() and not t.cancelled() and t.exception() is None]
        for d in held:
            if d is not None and d.claim is not None:
                d.claim.release()
        for task in list(self._preparing):
            task.cancel()

    async def next(self) -> Delivery:
        """The next live mail (waits for one, and for the client's credit). Raises
        BackendUnavailable when the broker channel died."""
        if self._pump is None:
            self._pump = asyncio.create_task(self._pump_messages())
        while True:
            if self._failure is not None:  # the channel died: what it prepared is the broker's again
                raise self._failure
            if self._finishing and not self._unanswered:
                raise BackendUnavailable("dequeue", "dequeue_svc is stopping (a rolling update or a scale-in): subscribe "
                                         "again; every answer this stream read was carried out")
            ready = self.ready(1)
            if ready:
                return ready[0]
            self._changed.clear()
            await self._changed.wait()

    def ready(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` prepared deliveries the client has credit for, handed out now (no wait);
        none once the client half-closed (``stop_handing_out``)."""
        out: list[Delivery] = []
        now = model.utcnow()
        while self._handing_out and len(out) < limit:
            picked = self._scheduler.pick(_prepared)
            if picked is None:
                break
            delivery = None if picked.cancelled() or picked.exception() is not None else picked.result()
            if delivery is None:  # ended while being prepared (or cancelled: its channel died): costs no credit
                continue
            self._scheduler.handed()
            delivery = dataclasses.replace(delivery, handed_out_at=now)
            message = self._stream.unsent.pop(delivery.tag, None)
            if message is not None:
                self._in_hand[delivery.tag] = message
            self._unanswered[delivery.tag] = delivery
            out.append(delivery)
        return out

    async def record_handed_out(self, batch: list[Delivery]) -> None:
        """Record the hand-out of deliveries ``ready`` gave, before they are sent: held to be
        written with their answers (services/app/handouts.py), or written now (one record for the
        batch) when the delay is 0. Raises BackendUnavailable then: the stream fails, and gives
        them back unsent."""
        await self._handouts.handed([(d.tag, mail_events.handed_out(d.mail, d.delivery_count)) for d in batch])

    def sent(self, batch: list[Delivery]) -> None:
        """The deliveries ``ready`` gave are on their way to the client: from now on they are
        answered, or go back (one attempt spent) when the stream ends."""
        for d in batch:
            self._in_hand.pop(d.tag, None)
        DELIVERED.labels(self.queue).inc(len(batch))  # counted once sent (one never sent is not)

    def unhand(self, batch: list[Delivery]) -> None:
        """The deliveries ``ready`` gave were never sent (their hand-out could not be recorded, or
        the stream ended first): they go back unsent when the stream closes, spending no delivery
        attempt, and their held hand-out events are dropped (nothing was handed to anyone)."""
        for d in batch:
            if self._unanswered.pop(d.tag, None) is None:
                continue
            message = self._in_hand.pop(d.tag, None)
            if message is not None:
                self._stream.unsent[d.tag] = message
            self._unhanded.append(d)
        self._handouts.withdrawn([d.tag for d in batch])

    def stop_handing_out(self) -> None:
        """The client half-closed: it can answer nothing more, so nothing more is handed out (what
        is prepared goes back, without spending a delivery attempt, when the stream closes)."""
        self._handing_out = False

    def finish(self) -> None:
        """The server is stopping: nothing more is handed out, and the stream ends (UNAVAILABLE,
        "subscribe again") once the client answered what it holds, so a graceful stop sends no
        mail twice (cut at the end of the grace, every delivery in hand would come back)."""
        self._handing_out = False
        self._finishing = True
        self._changed.set()

    async def _prepare(self, message: Message) -> Delivery | None:
        """Decode, claim, then judge and carry out (retried on a backend error); the claim goes
        with the Delivery, or is released here when the message ended without one."""
        try:
            mail = message.mail()
        except Exception:  # noqa: BLE001 - any undecodable body is poison
            log.error("undecodable message dead-lettered", extra={"queue": self.queue, "message_id": message.message_id})
            await self._stream.dead_letter(message.delivery_tag, "undecodable")
            return None
        claim = self._side.claims.take(self.queue, mail.enqueue_id, mail.generation)
        if claim is None:
            await self._stream.ack(message.delivery_tag, "in-flight")  # a second copy, not newer: the one held settles the mail
            return None
        try:
            # Kept, not requeued: on a quorum queue every requeue counts towards the delivery
            # limit, and an outage of a few seconds would dead-letter every mail in flight.
            delivery = await retrying(
                lambda: self._judged(message, mail, claim), PREPARE_BACKOFF, (BackendUnavailable,), log,
                extra={"queue": self.queue}, on_retry=lambda _e: RETRIED_ON_ERROR.labels(self.queue).inc(),
            )
        except BaseException as e:
            claim.release()
            if isinstance(e, Exception) and not isinstance(e, BackendUnavailable):  # a defect: said, never silent
                log.exception("a delivery could not be prepared: its message stays unacked with this stream, and "
                              "comes back when the stream ends", extra={"queue": self.queue, "enqueue_id": str(mail.enqueue_id)})
            raise
        if delivery is None or self._failure is not None:  # ended here, or its channel died meanwhile
            claim.release()
        if delivery is None:
            self._stream.arrived.discard(message.delivery_tag)
        return delivery

    async def _judged(self, message: Message, mail: model.QueuedMail, claim: Claim) -> Delivery | None:
        """One try: room asked once, the verdict, carried out. Raises BackendUnavailable when
        Cassandra or the blob store does not answer (nothing kept: the next try asks again)."""
        side = self._side
        admission = side.shaper.admit(self.queue, mail, message.reservation, model.utcnow()) if side.shaper.active else None
        ticket = None if isinstance(admission, Wait) else admission
        try:
            v = await verdict.judge(side.view.mails, side.rules, side.state, side.blobs, side.limits.dequeue_inline_bytes,
                                    self.queue, message, mail, room=not isinstance(admission, Wait))
            if v.action is not Action.DELIVER:
                side.shaper.release(ticket, handed_out=False)
                ticket = None
            # Carried out to the end once begun: cut by a closing stream between its publish and
            # its ack, a hold or a wait would leave a second copy of the mail in the queue.
            return await actions.to_the_end(self._committing, actions.carry_out(self._stream, actions.Step(message, mail, v, admission, claim)))
        except BaseException:
            side.shaper.release(ticket, handed_out=False)  # retried or cancelled: admitted again next time
            raise

    def settle(
        self, tag: int, outcome: Outcome, error_message: str = "", retry_after: dt.timedelta | None = None,
    ) -> asyncio.Future[None]:
        """Take the answer to ``tag`` and begin carrying it out, at once (no await between the two:
        an answer read is carried out, whatever happens to the stream next); the future of its end.
        InvalidArgument, raised here, for a tag that is not an unanswered delivery of this stream."""
        broker_tag = delivery_tags.inward(self.tag_prefix, tag)
        if broker_tag is None:
            raise InvalidArgument(f"delivery tag {tag} was not given out by this stream: answer each delivery on the "
                                  "stream that delivered it")
        delivery = self._unanswered.pop(broker_tag, None)  # taken first: a second answer for the tag is refused
        if delivery is None:
            raise InvalidArgument(f"delivery tag {tag} is not an unanswered delivery of this stream")
        self._scheduler.answered()
        self._changed.set()  # credit for one more delivery
        self._stream.arrived.discard(broker_tag)
        if self._failure is not None and outcome is not Outcome.SUCCESS:
            # Its channel died: the message is the broker's again, and maybe another stream's by
            # now (``_let_go``); a RETRY would publish a second copy beside it. A SUCCESS goes on:
            # its mark makes any copy skipped.
            delivery.end(self._side.shaper)
            raise BackendUnavailable("rabbitmq", "this stream's channel closed and its deliveries went back to the queue: "
                                     "subscribe again")
        # To the end once the tag is taken, whatever happens to the stream: a RETRY cut between
        # its publish and its ack would leave two copies (the new one, and the old one given back
        # by the closing channel), a SUCCESS cut after its mark would lose its counter update.
        if outcome is Outcome.REJECT:  # its claim let go if the channel dies meanwhile (``_let_go``)
            self._settling[delivery.tag] = delivery
        return actions.begun(self._committing, self._settled(delivery, outcome, error_message, retry_after))

    async def _settled(self, delivery: Delivery, outcome: Outcome, error_message: str, retry_after: dt.timedelta | None) -> None:
        try:
            handed = await self._handouts.answered(delivery.tag)
            try:
                await settlement.settle(self._stream, delivery, outcome, error_message, retry_after, handed=handed)
            except BaseException:
                self._handouts.unanswered(delivery.tag, handed)
                raise
        finally:
            self._settling.pop(delivery.tag, None)

    async def close(self) -> None:
        """Stop consuming and give back what the stream holds (services/app/closing.py), once
        every answer and every verdict under way has been carried out.

        The consumer's channel is closed whatever happens on the way: left open, the messages it
        holds unacked (and those the broker keeps sending it up to the prefetch) would stay with a
        consumer nobody reads, live in the view and in no queue, until the process ends.
        """
        try:
            if self._pump is not None:
                self._pump.cancel()
            preparing = list(self._preparing)
            for task in preparing:
                task.cancel()
            await asyncio.gather(*preparing, return_exceptions=True)  # let them unwind (and release) first
            while self._committing:  # answers and verdicts under way end first: they ack what they end
                await asyncio.gather(*self._committing, return_exceptions=True)
            # The held hand-outs before what the give-back records (a delivery on its last attempt
            # is dead-lettered there): a mail's events keep their order.
            await self._handouts.close()
            prepared = [t.result() for t in self._scheduler.queued()
                        if t.done() and not t.cancelled() and t.exception() is None and t.result() is not None]
            await closing.close(self._stream, prepared + self._unhanded, list(self._unanswered.values()))
        finally:
            try:
                try:
                    await self._stream.consumer.close()
                finally:
                    await self._handouts.close()  # already closed, unless something above failed
            finally:
                self._side.closed(self)


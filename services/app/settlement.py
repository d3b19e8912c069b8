"""A consumer's answer to a delivery, carried out (DESIGN §4).

- SUCCESS marks the mail deleted **then** acks: a crash between the two redelivers a mail that
  is then skipped. No loss, no ghost.
- RETRY counts an attempt and publishes the mail again with its backoff (services/domain/schedule.py),
  then records the new schedule, then acks: it never spends the broker's delivery limit. A RETRY
  past the queue's retry policy expires the mail: marked and dead-lettered.
- REJECT marks the mail dead-lettered and routes it to the dead-letter queue. Its mark (and an
  expiry's) is written only if the mail has none: one an operator's delete wrote while the
  consumer held the mail stays, and the message is only acked (a deleted mail never becomes a
  dead letter). A SUCCESS's mark is written blind (grouped, on the hot path).

The events of RETRY and REJECT (RETRY_SCHEDULED, REJECTED, EXPIRED, DEAD_LETTERED) are recorded
first, before anything changes: if one cannot be, nothing changed and the mail goes back to the
queue (delivered again, answered again: the same event id). A SUCCESS writes its DELIVERED event
and its deleted mark at once (``delivered``): its ack waits for one round of writes, not two in
a row. Marked without its event, the mail comes back and is skipped, and the skip writes the
event first (services/app/actions.py ``skip``): a delivered mail never ends without its event.

Whatever happens, the delivery ends: its claim and its room at its destination are given back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging

from prometheus_client import Counter

from services.app.delivery import Delivery, DequeueSide, Outcome, Stream
from services.domain import dead_letters, delays, model, schedule
from services.domain import events as mail_events
from services.domain.events import Event, EventType

log = logging.getLogger(__name__)

OUTCOMES = Counter("mailqueue_outcomes_total", "Consumer outcomes", ["queue", "outcome"])
EXPIRED = Counter("mailqueue_expired_total", "Mails expired by their queue's retry policy", ["queue"])


async def settle(
    s: Stream, d: Delivery, outcome: Outcome, error_message: str = "", retry_after: dt.timedelta | None = None,
    handed: list[Event] | None = None,
) -> None:
    """``handed``: the delivery's hand-out event not written yet (services/app/handouts.py),
    recorded with the answer's, before it; the list is emptied once that record is written (a
    step failing after it must not hold the event again)."""
    handed = [] if handed is None else handed
    try:
        if outcome is Outcome.SUCCESS:
            await delivered(s, d, handed)
            await s.ack(d.tag)
        elif outcome is Outcome.RETRY:
            await retry(s, d, model.truncated(error_message), retry_after, handed)
        elif not await _deleted_meanwhile(s, d, handed):
            reason = f"dead-lettered: {error_message}" if error_message else "dead-lettered"
            await _record(s.side, handed, mail_events.rejected(d.mail, model.truncated(error_message)))
            await _dead_letter(s, d, model.truncated(reason))
    finally:
        d.end(s.side.shaper)
    if outcome is Outcome.RETRY:
        s.side.shaper.observe_retry(d.mail, model.truncated(error_message))  # the rules see what is kept
    OUTCOMES.labels(s.queue, outcome.name).inc()


#: The deleted mark of a mail a consumer answered SUCCESS for.
DEQUEUED = "dequeued"


async def delivered(s: Stream, d: Delivery, handed: list[Event]) -> None:
    """The DELIVERED event and the deleted mark, written at once: the ack waits for one round of
    writes, not two in a row. Either may be written without the other: the answer then fails and
    the mail goes back to the queue. Marked, it comes back and is skipped, and the skip writes its
    event (``delivered_again``); not marked, it is delivered and answered again (the same id).

    A delivery the broker would dead-letter if it went back (its delivery limit reached) would
    never come back to be skipped: its event is written first, then its mark, as RETRY and REJECT
    do."""
    event = mail_events.delivered(d.mail)
    if retries_exhausted(d.delivery_count, s.side.broker.delivery_limit):
        await _record(s.side, handed, event)
        await s.side.mark_deleted(d.mail, DEQUEUED)
        return
    mark = asyncio.ensure_future(s.side.mark_deleted(d.mail, DEQUEUED))  # one task (gather's two cost a core's 2 %)
    try:
        await _record(s.side, handed, event)
    except BaseException:
        mark.add_done_callback(_retrieved)  # the answer fails either way; the mark's end is read, not awaited
        raise
    await mark


def redelivered_after_success(redelivered: bool, state: model.MailState | None, mail: model.QueuedMail) -> bool:
    """A mail marked delivered whose message came back (the broker's redelivered flag), in the
    generation it has: the copy a SUCCESS answered, whose writes may have left the mark alone."""
    return (redelivered and state is not None and state.deleted and state.reason == DEQUEUED
            and state.generation == mail.generation)


async def delivered_again(side: DequeueSide, mail: model.QueuedMail) -> None:
    """The DELIVERED event of a mail skipped by ``redelivered_after_success``, written again: the
    one in its history if there is one (its own time and actor; the stream may lack it), else a new
    one of this copy. One read and one write, only for a delivered mail's message that came back."""
    told = [e for e in await side.events.history(mail.enqueue_id) if e.type is EventType.DELIVERED]
    await side.events.record(told[-1:] or [mail_events.delivered(mail)])


async def retry(s: Stream, d: Delivery, error: str, retry_after: dt.timedelta | None, handed: list[Event]) -> None:
    """Count the attempt; publish the mail again with its backoff, record it, then ack.

    A crash before the record leaves two copies with one generation (a duplicate delivery at
    worst); after it, the redelivered original is older than the record and is skipped.
    """
    mail, now, side = d.mail, model.utcnow(), s.side
    # Not published again nor counted delayed (a count no arrival would end) when deleted
    # meanwhile, or when a newer copy carries the mail on.
    if await _deleted_meanwhile(s, d, handed, superseded_too=True):
        return
    attempts = mail.attempts + 1
    next_attempt = schedule.next_attempt(await side.state.retry_policy(s.queue), attempts, mail.enqueued_at, now, retry_after)
    if isinstance(next_attempt, schedule.Expired):
        log.info("mail expired", extra={"queue": s.queue, "enqueue_id": str(mail.enqueue_id), "reason": next_attempt.reason})
        reason = f"{next_attempt.reason}: {error}" if error else next_attempt.reason
        await _record(side, handed, mail_events.expired(mail, model.truncated(reason)))
        if not await side.mark_dead(mail, model.truncated(reason)):
            await s.ack(d.tag, "deleted")
            return
        # Its last attempt recorded too: the dead letter shows it (services/app/dead_letter_recorder.py).
        await side.view.mails.reschedule(dataclasses.replace(mail, attempts=attempts, last_error=error, generation=mail.generation + 1))
        await s.dead_letter(d.tag)
        EXPIRED.labels(s.queue).inc()
        return
    again = dataclasses.replace(mail, deliver_at=next_attempt.deliver_at, attempts=attempts, last_error=error,
                                generation=mail.generation + 1)
    # The claim is kept until the delivery ends (after the record): the new copy, newer, takes the
    # mail over if it comes back at once, while another copy of this generation arriving meanwhile
    # is a duplicate (released here first, such a copy was judged against the old record and
    # delivered beside the new one: two copies of the mail out at once).
    await _record(side, handed, mail_events.retry_scheduled(mail, error, next_attempt.deliver_at))
    await side.broker.publish(again, next_attempt.deliver_at - now, content=side.carry(mail, d.content))
    await side.view.mails.reschedule(again)
    await side.view.mails.count(again, delayed=1 if delays.units(next_attempt.deliver_at - now) else 0)
    await s.ack(d.tag)


async def _deleted_meanwhile(s: Stream, d: Delivery, handed: list[Event], superseded_too: bool = False) -> bool:
    """True, and the delivery acked, when an operator deleted its mail while the consumer held it:
    a RETRY or REJECT of it changes nothing and records nothing of its own (no false "dead-lettered"
    in its history), its hand-out is recorded all the same. One read, grouped with the other
    answers' (RETRY and REJECT only); the mark's lightweight transaction covers a delete after it.

    ``superseded_too`` (RETRY): also when a newer copy of the mail was published while this one
    was held (the healer republishes a mail held past its grace, and that copy may have been
    answered RETRY already): the newer copy carries the mail on. Rescheduled from this copy, the
    mail's generation would go back down, and the newer copy and this one's would both be
    delivered, and go on being delivered side by side."""
    state = await s.side.view.mails.state(d.mail.queue, d.mail.enqueue_id)
    if state is None:
        return False
    if superseded_too and not state.deleted and state.generation > d.mail.generation:
        log.info("RETRY of a copy a newer one superseded: acked", extra={
            "queue": s.queue, "enqueue_id": str(d.mail.enqueue_id), "generation": d.mail.generation,
            "newer": state.generation})
        reason = "superseded"
    elif not state.deleted or dead_letters.kind_of(state.reason) is not None:
        return False
    else:
        log.info("answer for a mail deleted meanwhile: acked", extra={"queue": s.queue, "enqueue_id": str(d.mail.enqueue_id)})
        reason = "deleted"
    if handed:
        await s.side.events.record(handed)
        handed.clear()
    await s.ack(d.tag, reason)
    return True


async def _record(side: DequeueSide, handed: list[Event], event: Event) -> None:
    """The answer's event, after the hand-out's still held (``handed``, emptied once written)."""
    await side.events.record([*handed, event])
    handed.clear()


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a deleted mark failed with its event: %s", task.exception())


def retries_exhausted(delivery_count: int, limit: int | None) -> bool:
    """True when a requeue would make the broker dead-letter the message (its delivery limit)."""
    return limit is not None and delivery_count >= limit


async def dead_letter_at_limit(s: Stream, d: Delivery, detail: str) -> None:
    """Mark and dead-letter a delivery that the broker would dead-letter unmarked if it came back."""
    if await _deleted_meanwhile(s, d, []):
        return
    log.warning("delivery limit reached: dead-lettered", extra={"queue": s.queue, "enqueue_id": str(d.mail.enqueue_id)})
    reason = f"dead-lettered: delivery limit of {s.side.broker.delivery_limit} reached{detail}"
    await s.side.events.record([mail_events.dead_lettered(d.mail, model.truncated(reason))])
    await _dead_letter(s, d, model.truncated(reason))


async def _dead_letter(s: Stream, d: Delivery, reason: str) -> None:
    """Mark and dead-letter the delivery's mail; only acked if it was marked meanwhile otherwise
    (an operator deleted it while the consumer held it: it stays deleted, not a dead letter)."""
    if await s.side.mark_dead(d.mail, reason):
        await s.dead_letter(d.tag)
    else:
        log.info("answered for a mail deleted meanwhile: acked, not dead-lettered",
                 extra={"queue": s.queue, "enqueue_id": str(d.mail.enqueue_id)})
        await s.ack(d.tag, "deleted")

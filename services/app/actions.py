"""Carrying out a delivery's verdict (services/app/verdict.py): one function per action.

Each gets the stream, the message, its decoded mail and the verdict, and either returns the
Delivery to hand out (DELIVER) or ends the message here and returns None. Only DELIVER keeps the
room its destination gave (the subscription gives it back for every other action).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import Counter

from services.app import settlement
from services.app.claims import Claim
from services.app.delivery import Delivery, Stream
from services.app.shaper import Wait
from services.app.verdict import Action, Verdict, carried
from services.domain import counts, model, rules
from services.domain import events as mail_events
from services.ports.broker import Message

log = logging.getLogger(__name__)
T = TypeVar("T")

INLINE_CONTENT = Counter(
    "mailqueue_delivery_content_total",
    "Contents handed out inline, by where they came from (message: carried by a small mail's message; blob_store: read)",
    ["queue", "source"],
)


@dataclasses.dataclass(frozen=True)
class Step:
    """A message being prepared: what arrived, what it carries, what was decided, the room taken."""

    message: Message
    mail: model.QueuedMail
    verdict: Verdict
    #: The shaper's answer, asked once before the verdict: a Ticket (room taken), a Wait (no
    #: room: the verdict is WAIT_FOR_ROOM) or None (no limit applies).
    admission: object = None
    #: This process's hold on the mail: a delivery keeps it until answered.
    claim: Claim | None = None


async def deliver(s: Stream, step: Step) -> Delivery:
    m, v = step.message, step.verdict
    if v.source:
        INLINE_CONTENT.labels(s.queue, v.source).inc()
    # A retried mail comes back in a new message: it was delivered before all the same.
    return Delivery(m.delivery_tag, step.mail, v.content, m.redelivered or step.mail.attempts > 0, m.delivery_count,
                    step.admission, step.claim)


async def skip(s: Stream, step: Step) -> None:
    """Acked, not handed out. A mail marked delivered whose answered message came back has its
    DELIVERED event written again first: the answer's writes may have left only the mark
    (services/app/settlement.py ``delivered``)."""
    if settlement.redelivered_after_success(step.message.redelivered, step.verdict.state, step.mail):
        await settlement.delivered_again(s.side, step.mail)
    await s.ack(step.message.delivery_tag, step.verdict.reason)


async def wait(s: Stream, step: Step) -> None:
    """Early (only a clock behind the publisher's, or a rounding): back to the delay ladder."""
    m = step.message
    await s.side.broker.publish(step.mail, step.verdict.early, counted=m.delayed, content=carried(m, step.mail))
    await s.ack(m.delivery_tag, step.verdict.reason)


async def wait_for_room(s: Stream, step: Step) -> None:
    """No room at its destination now: the mail waits in the delay ladder for its slot."""
    w = step.admission
    assert isinstance(w, Wait)
    await s.side.broker.publish(step.mail, w.delay, counted=False, content=carried(step.message, step.mail), reservation=w.reservation)
    await s.ack(step.message.delivery_tag, step.verdict.reason)


async def dead_letter(s: Stream, step: Step) -> None:
    if step.verdict.mark is not None:
        log.error("mail content missing: dead-lettered", extra={"queue": s.queue, "enqueue_id": str(step.mail.enqueue_id)})
        await s.side.events.record([mail_events.dead_lettered(step.mail, step.verdict.mark)])
        await s.side.view.mails.mark_gone(step.mail, step.verdict.mark)
    await s.dead_letter(step.message.delivery_tag, step.verdict.reason)


async def bounce(s: Stream, step: Step) -> None:
    assert step.verdict.rule is not None
    reason = model.truncated(rules.bounce_reason(step.verdict.rule))
    await s.side.events.record([mail_events.bounced(step.mail, step.verdict.rule, reason)])
    await s.side.mark_deleted(step.mail, reason)
    await s.dead_letter(step.message.delivery_tag, "bounced")


async def hold(s: Stream, step: Step) -> None:
    """Re-schedule to the rule's end, record, ack (services/domain/rules.py). The held copy is
    published once per message: a failure after it (its schedule record, its count) retries the
    preparation, whose hold finishes the one begun (``finish_hold``) rather than publish a second
    copy of the same generation."""
    assert step.verdict.rule is not None
    tag, now, mail = step.message.delivery_tag, model.utcnow(), step.mail
    held = s.held.get(tag)
    if held is None:
        held = dataclasses.replace(mail, deliver_at=rules.hold_until(step.verdict.rule, now), generation=mail.generation + 1,
                                   held_by=step.verdict.rule.rule_id)
        await s.side.events.record([mail_events.held(mail, step.verdict.rule)])
        await s.side.broker.publish(held, held.due() - now, content=carried(step.message, mail))
        s.held[tag] = held
    await finish_hold(s, tag, held)


async def finish_hold(s: Stream, tag: int, held: model.QueuedMail) -> None:
    """A hold whose copy is published: its schedule recorded, counted, the message acked."""
    await s.side.view.mails.reschedule(held)
    await s.side.view.mails.count(held, delayed=1, held=1)
    await s.ack(tag, "held")


ACTIONS: dict[Action, Callable[[Stream, Step], Awaitable[Delivery | None]]] = {
    Action.DELIVER: deliver, Action.SKIP: skip, Action.WAIT: wait, Action.WAIT_FOR_ROOM: wait_for_room,
    Action.DEAD_LETTER: dead_letter, Action.BOUNCE: bounce, Action.HOLD: hold,
}


async def end_delay(s: Stream, step: Step) -> None:
    """Its delay (or hold) ends with this arrival. A redelivered message (returned by a stream
    that ended) was counted on its first arrival; one a killed process never prepared was not:
    drift that ReconcileCounters heals."""
    m, state = step.message, step.verdict.state
    if not m.delayed or m.redelivered or m.delivery_tag in s.arrived:
        return
    s.arrived.add(m.delivery_tag)
    was_held = state is not None and counts.is_held(state)
    await s.side.view.mails.count(step.mail, delayed=-1, held=-1 if was_held else 0)
    if was_held:  # no longer held, whether or not a rule holds it again
        await s.side.view.mails.reschedule(dataclasses.replace(step.mail, held_by=counts.NOT_HELD))


async def to_the_end(under_way: set[asyncio.Future[object]], step: Awaitable[T]) -> T:
    """Run ``step`` (a verdict carried out, an answer settled) to its end even if its caller is
    cancelled (the stream closing); it stays in ``under_way`` until it ends, and the stream's close
    waits for those. Cut between a publish and its ack, a step would leave a second copy of the mail."""
    task = begun(under_way, step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_log_error)  # the stream ended: nobody else will say it failed
        raise


def begun(under_way: set[asyncio.Future[object]], step: Awaitable[T]) -> asyncio.Future[T]:
    """``step`` started now, as ``to_the_end`` runs it (never cancelled; in ``under_way`` until it
    ends): for a caller that must not be cut between taking a step and starting it."""
    task = asyncio.ensure_future(step)
    under_way.add(task)
    task.add_done_callback(under_way.discard)
    task.add_done_callback(_read_error)  # read here too: a caller cancelled meanwhile never reads it
    return task


def _read_error(task: asyncio.Future[object]) -> None:
    """Mark a finished step's error read (never 'exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


def log_failure(task: asyncio.Future[object]) -> None:
    """Log a step's failure that nobody will read (its stream ended)."""
    _log_error(task)


def _log_error(task: asyncio.Future[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a step under way when its stream ended failed: %s", task.exception())


async def carry_out(s: Stream, step: Step) -> Delivery | None:
    """The verdict, carried out: a delay's arrival is counted first, then the action runs."""
    if step.verdict.arrived:
        await end_delay(s, step)
    return await ACTIONS[step.verdict.action](s, step)

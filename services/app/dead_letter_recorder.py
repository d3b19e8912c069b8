"""Records every dead letter in the repository (services/domain/dead_letters.py), and marks in the
view every mail the broker dead-lettered on its own (DESIGN §5: a dead letter is never shown as a
queued mail). It runs in dequeue_svc; what operators do with the dead letters it records (browse,
count, redrive, purge) is services/app/dead_letter_admin.py, in browse_svc.

dequeue_svc marks what it dead-letters (REJECT, expiry, poison, the last allowed delivery) before
routing it. The broker also dead-letters by itself: a quorum queue's delivery limit reached by
deliveries that consumers left unanswered when they were killed. Every queue's dead-letter
exchange feeds one shared queue (names.dead_letter_marks_queue); each dequeue_svc replica
consumes it, marks the mails that have no mark yet, records each dead letter with its kind and
reason (once: a redelivered copy finds its record), and acks. The broker's per-queue dead-letter
queues keep their copies too. A mail the broker dead-lettered by itself is recorded
DEAD_LETTERED (actor ``component:broker``) before it is marked, its id that of its attempt: a
copy seen again writes the same event.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from services.app.retry import retrying
from services.domain import dead_letters, model
from services.domain import events as mail_events
from services.domain.backoff import Backoff
from services.domain.errors import BackendUnavailable, FailedPrecondition
from services.domain.events import Actor
from services.ports.broker import Broker
from services.ports.events import EventLog, Unrecorded
from services.ports.view import View

log = logging.getLogger(__name__)

MARKED = Counter(
    "mailqueue_broker_dead_letters_marked_total", "Mails the broker dead-lettered by itself, marked in the view", ["queue", "reason"],
)
RECORDED = Counter("mailqueue_dead_letters_recorded_total", "Dead letters kept in the repository, by kind", ["queue", "kind"])
PREFETCH = 32
#: The actor of what the broker dead-lettered by itself.
BROKER = Actor.component("broker")
#: After a backend error, marking resumes on a new consumer after this.
BACKOFF = Backoff("dead-letter marking", initial_s=2.0, multiplier=1.0, max_s=2.0)


def reason_for(death_reason: str | None, delivery_limit: int | None) -> str:
    if death_reason == "delivery_limit":
        return f"dead-lettered by the broker: delivery limit of {delivery_limit} reached (deliveries left unanswered)"
    return f"dead-lettered by the broker: {death_reason or 'unknown reason'}"


async def mark_forever(view: View, broker: Broker, events: EventLog | None = None) -> None:
    """Consume the dead-letter copies and mark their mails, until cancelled; survives outages."""
    log_ = events if events is not None else Unrecorded()
    # FailedPrecondition: its channel closed by the broker's consumer timeout (a record held past
    # it by a Cassandra that does not answer): a new consumer, as after an outage.
    await retrying(lambda: _mark(view, broker, log_), BACKOFF, (BackendUnavailable, FailedPrecondition), log)


async def _mark(view: View, broker: Broker, events: EventLog) -> None:
    """Mark until the broker or Cassandra fails (BackendUnavailable)."""
    consumer = await broker.consume_dead_letters(PREFETCH)
    try:
        while True:
            message = await consumer.get()
            try:
                mail = message.mail()
            except Exception:  # noqa: BLE001 - nothing to mark
                await consumer.ack(message.delivery_tag)
                continue
            await _record(view, broker, mail, message.death_reason, events)
            await consumer.ack(message.delivery_tag)
    finally:
        await consumer.close()


async def _record(view: View, broker: Broker, mail: model.QueuedMail, death_reason: str | None, events: EventLog) -> None:
    """Mark the mail if the broker dead-lettered it by itself, then keep it in the repository
    when its mark says it died (a copy of a mail dequeued, deleted or moved meanwhile is not kept)."""
    state = await view.mails.state(mail.queue, mail.enqueue_id)
    if state is not None and not state.deleted and state.generation > mail.generation:
        return  # a superseded copy: the mail lives on in its newer message
    if state is None or not state.deleted:
        reason = reason_for(death_reason, broker.delivery_limit)
        await events.record([mail_events.dead_lettered(mail, reason, actor=BROKER)])
        await view.mails.mark_gone(mail, reason)
        MARKED.labels(mail.queue, death_reason or "unknown").inc()
        log.warning("marked a mail the broker dead-lettered",
                    extra={"queue": mail.queue, "enqueue_id": str(mail.enqueue_id), "reason": reason})
    else:
        reason = state.reason or ""
    kind = dead_letters.kind_of(reason)
    if kind is None:
        return
    current = state.applied_to(mail) if state is not None else mail
    if await view.dead_letters.record(dead_letters.DeadLetter(current, kind, reason, model.utcnow())):
        RECORDED.labels(mail.queue, kind).inc()

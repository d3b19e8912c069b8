"""The events of a mail's own path (enqueue, hand-out, answers, rules), each with its stable id.

Ids (services/domain/events.py ``event_id``): the step of a mail's change is its delivery attempt
(``attempts + 1`` from its first hand-out on; 0 for ENQUEUED), so the same change carried out
again (a redelivered mail answered again, an enqueue answered again by its idempotency key) has
the same id, while each attempt's changes have their own. A hand-out is further told apart by the
broker's delivery count: the mail given back unanswered and handed out again is a new hand-out.

The actor is the current one (the caller, set per RPC by the access-control interceptor),
except for what a component decides on its own: an operator rule (``rule``) and the retry
policy's expiry (``expiry``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from services.domain import model
from services.domain.events import Actor, Event, EventType, of_mail


class Unrecorded:
    """An EventLog that keeps nothing: MAILQUEUE_EVENTS=off (to measure what events cost), and
    the use-cases built without one (bench/)."""

    async def record(self, events: Sequence[Event]) -> None:
        return None

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        return []

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        return []


RULE = Actor.component("rule")
EXPIRY = Actor.component("expiry")


def enqueued(mail: model.QueuedMail, actor: Actor | None = None) -> Event:
    """``actor``: the caller that enqueued it, taken when the call was made (its group may run in
    another caller's task); None: the current one."""
    return of_mail(EventType.ENQUEUED, mail, step=0, at=mail.enqueued_at, actor=actor)


def resent(queued: model.QueuedMail, result: model.EnqueueResult) -> Event:
    """An idempotency key answered with an earlier enqueue: the same event as that enqueue's (same
    id, same time, its mail as queued), marked resent; it overwrites the first record, never adds
    a second."""
    return of_mail(EventType.ENQUEUED, queued, step=0, at=result.enqueued_at, details={"resent": "true"})


def _attempt(mail: model.QueuedMail) -> int:
    return mail.attempts + 1


def handed_out(mail: model.QueuedMail, delivery_count: int) -> Event:
    return _of_attempt(EventType.HANDED_OUT, mail, discriminator=str(delivery_count))


def delivered(mail: model.QueuedMail) -> Event:
    return _of_attempt(EventType.DELIVERED, mail)


def retry_scheduled(mail: model.QueuedMail, error: str, next_attempt_at: dt.datetime) -> Event:
    return _of_attempt(EventType.RETRY_SCHEDULED, mail, reason=error,
                       details={"next_attempt_at": next_attempt_at.astimezone(dt.timezone.utc).isoformat()})


def rejected(mail: model.QueuedMail, error: str) -> Event:
    return _of_attempt(EventType.REJECTED, mail, reason=error)


def expired(mail: model.QueuedMail, reason: str) -> Event:
    return _of_attempt(EventType.EXPIRED, mail, reason=reason, actor=EXPIRY)


def dead_lettered(mail: model.QueuedMail, reason: str, actor: Actor | None = None) -> Event:
    return _of_attempt(EventType.DEAD_LETTERED, mail, reason=reason, actor=actor)


def held(mail: model.QueuedMail, rule: model.Rule) -> Event:
    return of_mail(EventType.HELD, mail, step=mail.generation, discriminator=str(rule.rule_id), actor=RULE,
                   reason=rule.reason, details={"rule_id": str(rule.rule_id)})


def bounced(mail: model.QueuedMail, rule: model.Rule, reason: str) -> Event:
    return of_mail(EventType.BOUNCED, mail, discriminator=str(rule.rule_id), actor=RULE, reason=reason,
                   details={"rule_id": str(rule.rule_id)})


def _of_attempt(kind: EventType, mail: model.QueuedMail, **fields: Any) -> Event:
    """An event of the delivery attempt under way (the mail's ``attempts`` counts the RETRYs so far)."""
    attempt = _attempt(mail)
    return of_mail(kind, mail, step=attempt, attempt=attempt, **fields)

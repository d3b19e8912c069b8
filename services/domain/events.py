"""Events: one record per state change, with who made it (DESIGN §11; protos/mailqueue/v1/events.proto).

An event is written as part of the change it records. Its id is derived from what changed (the
type, the mail, the copy's generation or attempt, and a discriminator the change names), never
drawn at random: a change carried out twice (a retry after a crash, the healer completing a
move) writes the same event id twice, and readers keep one.

The actor of a change is who asked for it: the caller of the RPC (its role and identity, set once
per call by the access-control interceptor in ``current_actor``), or a component acting on its own
(the healer, the retry policy's expiry, the retention sweep, an operator rule), which sets its
own actor around its work (``acting_as``).

The enqueue ids themselves are drawn at random, in groups whose shared tail names the history
partition of their events (the last section: ``new_ids``, ``history_key``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import enum
import hashlib
import random
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from services.domain import model


class EventType(enum.Enum):
    """What changed; the values are the proto enum's names without ``EVENT_TYPE_``, lower case."""

    ENQUEUED = "enqueued"
    HANDED_OUT = "handed_out"
    DELIVERED = "delivered"
    RETRY_SCHEDULED = "retry_scheduled"
    REJECTED = "rejected"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED = "expired"
    HELD = "held"
    BOUNCED = "bounced"
    MOVED = "moved"
    DELETED = "deleted"
    CLEARED = "cleared"
    PURGED = "purged"
    REDRIVEN = "redriven"
    REPUBLISHED = "republished"
    SWEPT = "swept"
    QUEUE_CREATED = "queue_created"
    QUEUE_DELETED = "queue_deleted"
    CONFIG_CHANGED = "config_changed"
    RULE_CHANGED = "rule_changed"
    SHAPING_CHANGED = "shaping_changed"
    QUOTA_CHANGED = "quota_changed"
    FLUSHED = "flushed"
    RELEASED = "released"
    COUNTERS_RECONCILED = "counters_reconciled"
    BROWSE_START_MOVED = "browse_start_moved"


#: Written to the mail history only, never to the event stream (the sweep writes its history rows
#: from Spark): a watch of these types alone would wait forever.
HISTORY_ONLY = frozenset({EventType.SWEPT})


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who made a change: a caller (role, identity) or a component (identity: its name)."""

    kind: str  # "caller" or "component"
    role: str = ""
    identity: str = "anonymous"

    @classmethod
    def component(cls, name: str) -> Actor:
        return cls("component", "", name)


#: The retention sweep (spark/sweep.py): the actor of its SWEPT events.
SWEEP = Actor.component("sweep")
#: A caller with no credentials (access control off): what the interceptor sets when it knows no more.
ANONYMOUS = Actor("caller", "", "anonymous")
#: The actor of the change being made, set per RPC by the interceptor, or by a component.
current_actor: contextvars.ContextVar[Actor] = contextvars.ContextVar("mailqueue_actor", default=ANONYMOUS)


@contextlib.contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Changes made inside are recorded as ``actor``'s (a component's own work)."""
    token = current_actor.set(actor)
    try:
        yield
    finally:
        current_actor.reset(token)


#: Namespace of event ids (uuid5 of the change's identity).
EVENT_IDS = uuid.UUID("0b4f3a0e-55c1-5c7e-8f0a-6b2d1e9c7d42")


def event_id(kind: EventType, queue: str, enqueue_id: uuid.UUID | None, step: int | str = 0, discriminator: str = "") -> str:
    """The id of one change: the same arguments, the same id. ``step`` tells apart the changes of one
    type a mail goes through (its attempt, its copy's generation); ``discriminator`` anything else
    the change names (a rule id, a target queue, a queue-level change's version)."""
    return uuid5_text(f"{_KIND_TEXT[kind]}|{queue}|{enqueue_id or ''}|{step}|{discriminator}")


#: Each type's text in an id (an enum's ``value`` is a descriptor: slower to read than a dict).
_KIND_TEXT = {k: k.value for k in EventType}
#: The namespace's SHA-1 state, copied for each id (hashing its 16 bytes again costs as much).
_EVENT_IDS_SHA1 = hashlib.sha1(EVENT_IDS.bytes)
#: A hex digit with the RFC 4122 variant set in its top two bits (10xx).
_VARIANT = {c: format(int(c, 16) & 0x3 | 0x8, "x") for c in "0123456789abcdef"}


def uuid5_text(name: str) -> str:
    """``str(uuid.uuid5(EVENT_IDS, name))`` without the UUID object: a delivery records two events,
    and the object's construction and formatting were a third of the cost of making one. The
    digest's hex with the version (5) and the variant written in (tests/unit/test_event_ids.py)."""
    h = _EVENT_IDS_SHA1.copy()
    h.update(name.encode())
    x = h.hexdigest()
    return f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{_VARIANT[x[16]]}{x[17:20]}-{x[20:32]}"


@dataclasses.dataclass(slots=True)
class Event:
    """One change. A value: never changed once made (``dataclasses.replace`` makes another). Not
    declared frozen: a frozen dataclass sets each of its 14 fields through ``object.__setattr__``,
    2.5 µs an event against 0.7, and a delivered mail makes two."""

    id: str
    time: dt.datetime
    type: EventType
    queue: str
    enqueue_id: uuid.UUID | None
    actor: Actor
    name: str = ""
    sender: str = ""
    attempt: int = 0
    reason: str = ""
    replica: str = ""
    traceparent: str = ""
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The position in the event stream (empty until the stream gave it one).
    cursor: str = ""


def of_mail(
    kind: EventType, mail: model.QueuedMail, *, step: int | str | None = None, reason: str = "", replica: str = "",
    details: Mapping[str, str] | None = None, discriminator: str = "", actor: Actor | None = None,
    at: dt.datetime | None = None, traceparent: str = "", attempt: int | None = None,
) -> Event:
    """An event of one mail; its step is the mail's attempt unless named (its ``attempt`` too: the
    attempt under way for a delivery's events); its actor the current one;
    its traceparent the mail's (the producer's, services/domain/trace.py) unless given."""
    step = mail.attempts if step is None else step
    return Event(
        id=event_id(kind, mail.queue, mail.enqueue_id, step, discriminator), time=at or model.utcnow(), type=kind,
        queue=mail.queue, enqueue_id=mail.enqueue_id, actor=actor or current_actor.get(), name=mail.mail.name,
        sender=mail.mail.sender, attempt=mail.attempts if attempt is None else attempt, reason=reason, replica=replica,
        traceparent=traceparent or mail.traceparent, details=dict(details) if details else {},
    )


def of_queue(
    kind: EventType, queue: str, discriminator: str, *, details: Mapping[str, str] | None = None, replica: str = "",
    actor: Actor | None = None, at: dt.datetime | None = None,
) -> Event:
    """A queue-level (or, with queue "", install-level) event; ``discriminator`` names the change's
    version (a config version, a rule id and its change) so that its id is stable."""
    return Event(
        id=event_id(kind, queue, None, 0, discriminator), time=at or model.utcnow(), type=kind, queue=queue, enqueue_id=None,
        actor=actor or current_actor.get(), replica=replica, details=dict(details or {}),
    )


# ------------------------------------------------------------------ the events of a mail's own path
# (enqueue, hand-out, answers, rules), each with its stable id. The step of a mail's change is its
# delivery attempt (``attempts + 1`` from its first hand-out on; 0 for ENQUEUED), so the same
# change carried out again (a redelivered mail answered again, an enqueue answered again by its
# idempotency key) has the same id, while each attempt's changes have their own. A hand-out is
# further told apart by the broker's delivery count: the mail given back unanswered and handed out
# again is a new hand-out. The actor is the current one (the caller, set per RPC by the
# access-control interceptor), except for what a component decides on its own: an operator rule
# (``RULE``) and the retry policy's expiry (``EXPIRY``).

RULE = Actor.component("rule")
EXPIRY = Actor.component("expiry")


def enqueued(mail: model.QueuedMail, actor: Actor | None = None) -> Event:
    """``actor``: the caller that enqueued it, taken when the call was made (its group may run in
    another caller's task); None: the current one."""
    return of_mail(EventType.ENQUEUED, mail, step=0, at=mail.enqueued_at, actor=actor)


def resent(queued: model.QueuedMail, result: model.EnqueueResult) -> Event:
    """An idempotency key answered with an earlier enqueue: the same event as that enqueue's (same
    id, same time, its mail as queued), marked resent; it overwrites the first record, never adds
    a second. Its attempt is 0, as the first's, whatever the mail has lived since; its actor is the
    caller that sent it again."""
    return of_mail(EventType.ENQUEUED, queued, step=0, attempt=0, at=result.enqueued_at, details={"resent": "true"})


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


#: Events that give the mail a new enqueue id (details "to_enqueue_id"): its story goes on there.
LANDINGS = (EventType.MOVED, EventType.REDRIVEN)
#: Within one millisecond, events of one attempt sort by the order a mail lives them.
_RANK = {EventType.ENQUEUED: 0, EventType.HANDED_OUT: 1}


def ordered(events: list[Event]) -> list[Event]:
    """Oldest first; ties (one millisecond) by attempt, then a hand-out before its answer."""
    return sorted(events, key=lambda e: (e.time, e.attempt, _RANK.get(e.type, 2), e.id))


def landed_id(e: Event) -> uuid.UUID | None:
    """The enqueue id a move or a redrive gave the mail (None for any other event)."""
    to = e.details.get("to_enqueue_id") if e.type in LANDINGS else None
    return uuid.UUID(to) if to else None


# ---------------------------------------------------------------------- enqueue ids and history keys
# Enqueue ids, and the history partition each one names (docs/pages/concepts/events.md).
#
# The mails of one enqueue group get ids that share their last 96 bits: a random tail, drawn once
# per at most ``PER_KEY`` mails, and 32 random bits of their own in front (distinct within the
# group). The tail, with the first 32 bits zeroed, is the mail's *history key*: the partition of
# ``mail_history_groups_v1`` that holds the events of every mail of the group. So the events of a
# change to many mails (a group enqueued, a batch handed out and answered) are a few rows, one per
# key, rather than one row per event; and a mail's history is still one partition read, found from
# its id alone, at any depth and any history size.
#
# The part a mail has of its own comes first, so ids still differ in their first characters: the
# 8-character prefixes ``mailq`` prints and accepts tell the mails of a group apart as before. Any
# UUID has a key: an id made elsewhere (a moved copy's, a keyed mail's claimed id) is a group of
# one. The ids stay version-4 UUIDs (the version and variant bits are in the shared tail), so
# nothing in the contract changes.

#: Mails whose ids share one tail, at most: bounds a history partition (a few events each).
PER_KEY = 256
_OWN_BITS = 32
_TAIL = (1 << (128 - _OWN_BITS)) - 1
_random = random.SystemRandom()


def new_ids(n: int) -> list[uuid.UUID]:
    """``n`` new enqueue ids, in groups of at most PER_KEY sharing a history key."""
    out: list[uuid.UUID] = []
    for start in range(0, n, PER_KEY):
        tail = uuid.uuid4().int & _TAIL
        out.extend(uuid.UUID(int=own << (128 - _OWN_BITS) | tail)
                   for own in _random.sample(range(1 << _OWN_BITS), min(PER_KEY, n - start)))
    return out


def history_key(enqueue_id: uuid.UUID) -> uuid.UUID:
    """The history partition of a mail: its id with its own (first) 32 bits zeroed."""
    return uuid.UUID(int=history_key_int(enqueue_id))


def history_key_int(enqueue_id: uuid.UUID) -> int:
    """``history_key`` as its integer: what a writer groups by, making the UUID once per key."""
    return enqueue_id.int & _TAIL

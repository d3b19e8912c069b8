"""What one delivery is, and what the steps of its path share (services/app/subscription.py).

- ``Delivery``: a live mail handed to a consumer, with its claim and shaping ticket.
- ``Outcome``: the consumer's answer.
- ``Stream``: one subscription's broker consumer and the messages it received but has not handed
  out (``unsent``); every step that ends a message's life here goes through ``ack`` or
  ``dead_letter``, so the bookkeeping lives in one place.
- ``DequeueSide``: what a step uses of its process (services/app/dequeuer.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter

from services.domain import model
from services.ports.broker import Consumer, Message

if TYPE_CHECKING:
    from services.app.claims import Claim, Claims
    from services.app.queue_state import QueueState
    from services.app.rule_book import RuleBook
    from services.app.shaper import Shaper
    from services.domain.settings import LimitSettings
    from services.ports.blobstore import BlobStore
    from services.ports.broker import Broker
    from services.ports.events import EventLog
    from services.ports.view import View

SKIPPED = Counter("mailqueue_skipped_total", "Deliveries acked without handing them out", ["queue", "reason"])

DEFAULT_PREFETCH = 16


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
    #: This process's hold on the mail (services/app/claims.py), released when the delivery ends.
    claim: Claim | None = dataclasses.field(default=None, compare=False)
    #: When it was handed to the client (None until then).
    handed_out_at: dt.datetime | None = None

    def end(self, shaper: Shaper) -> None:
        """Give back what the delivery holds: its claim on the mail and its room at its destination."""
        if self.claim is not None:
            self.claim.release()
        shaper.release(self.ticket)  # type: ignore[arg-type]


class DequeueSide(Protocol):
    """What a subscription's steps use of the dequeue side of its process."""

    view: View
    broker: Broker
    blobs: BlobStore
    limits: LimitSettings
    state: QueueState
    rules: RuleBook
    shaper: Shaper
    #: One claim per mail being prepared or handed out by this process.
    claims: Claims
    #: Where each change of a mail is recorded, before it is carried out.
    events: EventLog
    #: Seconds a hand-out event waits to be written with its answer's (services/app/handouts.py).
    handout_event_delay_s: float

    def carry(self, mail: model.QueuedMail, content: bytes | None) -> bytes | None: ...

    async def mark_deleted(self, mail: model.QueuedMail, reason: str) -> None: ...

    async def mark_dead(self, mail: model.QueuedMail, reason: str) -> bool:
        """Mark a mail a consumer's answer dead-letters; False when it was marked meanwhile
        otherwise than as a dead letter (an operator deleted it, a copy was delivered): the answer
        then only acks."""
        ...

    def closed(self, sub: object) -> None:
        """A subscription of this process ended."""


@dataclasses.dataclass
class Stream:
    """One subscription's consumer and its messages not handed out yet, by delivery tag."""

    queue: str
    consumer: Consumer
    side: DequeueSide
    unsent: dict[int, Message] = dataclasses.field(default_factory=dict)
    #: Tags whose arrival already ended their counted delay (a retried preparation must not again).
    arrived: set[int] = dataclasses.field(default_factory=set)
    #: Tags whose mail was held and its held copy published, not yet acked: a preparation retried
    #: (a write after the publish failed) or a closing stream finishes it, never publishes again.
    held: dict[int, model.QueuedMail] = dataclasses.field(default_factory=dict)

    async def ack(self, tag: int, reason: str | None = None) -> None:
        """Ack a message; ``reason``: it was not handed out (counted as skipped, by reason)."""
        self.unsent.pop(tag, None)
        self.held.pop(tag, None)
        await self.consumer.ack(tag)
        if reason is not None:
            SKIPPED.labels(self.queue, reason).inc()

    async def dead_letter(self, tag: int, reason: str | None = None) -> None:
        self.unsent.pop(tag, None)
        self.held.pop(tag, None)
        await self.consumer.dead_letter(tag)
        if reason is not None:
            SKIPPED.labels(self.queue, reason).inc()

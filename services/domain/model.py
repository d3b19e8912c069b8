"""Domain objects. Domain code takes and returns these, never protobuf (see services/contract/serde.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid
from typing import Any

#: The null sender "<>" (bounces) is the empty string in every layer.
NULL_SENDER = ""
#: Delivery classes, first served first.
PRIORITIES = ("high", "normal", "low")


@dataclasses.dataclass(frozen=True)
class Header:
    name: str
    value: str


@dataclasses.dataclass(frozen=True)
class PerRecipientHeaders:
    recipient: str
    headers: tuple[Header, ...]


@dataclasses.dataclass(frozen=True)
class Mail:
    """What a producer hands over: James's Mail, minus the content."""

    name: str
    sender: str
    recipients: tuple[str, ...]
    state: str = ""
    error_message: str = ""
    remote_host: str = ""
    remote_addr: str = ""
    last_updated: dt.datetime | None = None
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)
    per_recipient_headers: tuple[PerRecipientHeaders, ...] = ()


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    blob_id: str
    size: int
    deduplicated: bool = False


@dataclasses.dataclass(frozen=True)
class QueuedMail:
    """A mail as the queue holds it: the view row and the RabbitMQ message body."""

    queue: str
    enqueue_id: uuid.UUID
    enqueued_at: dt.datetime
    mail: Mail
    blob_ids: tuple[str, ...]
    size: int
    slice_start: dt.datetime
    bucket: int
    #: When the mail becomes deliverable; None: at ``enqueued_at``.
    deliver_at: dt.datetime | None = None
    #: RETRY outcomes so far, and the error message of the last one.
    attempts: int = 0
    last_error: str = ""
    #: Schedule version: a broker message older than the mail's stored schedule is dropped
    #: (it was superseded by a RETRY or a Flush). Carried in a message header, not in the body.
    generation: int = 0
    #: The hold rule that re-scheduled the mail, while it holds it.
    held_by: uuid.UUID | None = None
    #: Delivery class: "high", "normal" or "low" (PRIORITIES).
    priority: str = "normal"
    #: The W3C traceparent its producer gave at Enqueue ("" if none): handed out with every
    #: delivery, written on its events (services/domain/trace.py).
    traceparent: str = ""

    def due(self) -> dt.datetime:
        """When the mail is deliverable."""
        return self.deliver_at if self.deliver_at is not None else self.enqueued_at


@dataclasses.dataclass(frozen=True)
class MailState:
    """What the view knows of a mail besides its row: gone (and why), or its current schedule."""

    reason: str | None = None
    generation: int = 0
    deliver_at: dt.datetime | None = None
    attempts: int = 0
    last_error: str = ""
    held_by: uuid.UUID | None = None
    #: Landed whole (a move's copy, a redrive) and its message not known published: a landing cut
    #: between its schedule record and its publish (services/app/moves.py ``land``).
    unpublished: bool = False

    @property
    def deleted(self) -> bool:
        return self.reason is not None

    def applied_to(self, q: QueuedMail) -> QueuedMail:
        """The row's mail with this schedule, when the schedule is newer than the row's."""
        if self.generation <= q.generation:
            return q
        return dataclasses.replace(
            q, deliver_at=self.deliver_at, attempts=self.attempts, last_error=self.last_error, generation=self.generation,
            held_by=self.held_by,
        )


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a queue spaces RETRYs and when a mail expires (see services/domain/schedule.py)."""

    initial_backoff: dt.timedelta = dt.timedelta(minutes=1)
    multiplier: float = 2.0
    max_backoff: dt.timedelta = dt.timedelta(hours=1)
    max_attempts: int = 20
    max_age: dt.timedelta = dt.timedelta(days=5)


@dataclasses.dataclass(frozen=True)
class Rule:
    """An operator's hold or bounce (services/domain/rules.py). Condition fields combine with AND;
    empty ones match everything."""

    rule_id: uuid.UUID
    kind: str  # "hold" or "bounce"
    expires_at: dt.datetime
    created_at: dt.datetime
    queue: str = ""
    recipient_domain: str = ""
    sender: str = ""
    name: str = ""
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class EnqueueResult:
    """What a producer is told: the mail is durably queued under ``enqueue_id``."""

    enqueue_id: uuid.UUID
    enqueued_at: dt.datetime
    blob_ids: tuple[str, ...]
    size: int
    #: True when an idempotency key matched an earlier enqueue (nothing new was queued).
    duplicate: bool = False

    @classmethod
    def of(cls, q: QueuedMail) -> EnqueueResult:
        return cls(q.enqueue_id, q.enqueued_at, q.blob_ids, q.size)


@dataclasses.dataclass(frozen=True)
class IdempotencyClaim:
    """Who holds an idempotency key: an enqueue in progress, or (``result`` set) a finished one."""

    enqueue_id: uuid.UUID
    claimed_at: dt.datetime
    result: EnqueueResult | None = None
    #: The lease of the enqueuer whose attempt holds it (None: claimed by a version without leases).
    owner: uuid.UUID | None = None
    #: The instant its mail is enqueued at, set by the first claim and kept by every take-over
    #: (None: claimed by a version that did not set it; its claim instant stands in).
    enqueued_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class ViewConfig:
    """The shape of the Cassandra time-series view (DESIGN §3)."""

    slice_window: dt.timedelta = dt.timedelta(hours=1)
    bucket_count: int = 1
    update_browse_start_pace: int = 1000


def utcnow() -> dt.datetime:
    """Now, in UTC, at Cassandra's millisecond precision (from the clock's whole milliseconds: half the
    cost of ``now()`` then ``replace``, and read several times per mail)."""
    return dt.datetime.fromtimestamp(time.time_ns() // 1_000_000 / 1000, dt.timezone.utc)


@dataclasses.dataclass(frozen=True)
class Summary:
    """A queue's live mails by schedule, from one pass over the view."""

    size: int = 0
    ready: int = 0
    delayed: int = 0
    #: Mails an active hold rule holds or will hold when they come up (size = ready + delayed + held).
    held: int = 0
    #: How long the oldest ready mail has been deliverable; None when no mail is ready.
    oldest_ready_age: dt.timedelta | None = None
    #: Age of the oldest live mail; None when the queue is empty.
    oldest_age: dt.timedelta | None = None


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    """Everything GetQueue tells about a queue."""

    queue: str
    summary: Summary
    #: True when the counts come from the counters (cheap, may lag a second), not from a view scan.
    approximate: bool
    config: ViewConfig
    retry_policy: RetryPolicy
    dead_lettered: int
    browse_start: dt.datetime | None
    content_start: dt.datetime | None
    #: The traffic shaping throttles its mails are held to (services/domain/shaping.py Throttle).
    throttles: tuple[Any, ...] = ()


#: A reason (why a mail is gone) or a consumer's error message is stored at most this long.
MAX_REASON = 1000


def truncated(text: str) -> str:
    """``text`` as a reason or error message is stored (at most MAX_REASON characters)."""
    return text[:MAX_REASON]

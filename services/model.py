"""Domain objects. Domain code takes and returns these, never protobuf (see services/serde.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

#: The null sender "<>" (bounces) is the empty string in every layer.
NULL_SENDER = ""


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
class ViewConfig:
    """The shape of the Cassandra time-series view (DESIGN §3)."""

    slice_window: dt.timedelta = dt.timedelta(hours=1)
    bucket_count: int = 1
    update_browse_start_pace: int = 1000


def utcnow() -> dt.datetime:
    """Now, in UTC, at Cassandra's millisecond precision."""
    now = dt.datetime.now(dt.timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)

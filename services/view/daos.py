"""One DAO per table of the view. Each takes and returns domain objects; all calls are async."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE

from services import model
from services.view import schema
from services.view.session import execute, execute_all


def _unset_if_empty(value: Any) -> Any:
    """Absent values are left unset, never written as null (a null cell is a tombstone)."""
    return value if value not in (None, "", [], {}, ()) else UNSET_VALUE


class EnqueuedMailsDAO:
    """``enqueued_mails``: the time series, one partition per (queue, slice, bucket)."""

    COLUMNS = (
        "queue_name, slice_start, bucket, enqueued_at, enqueue_id, name, sender, recipients, state, error_message, "
        "remote_host, remote_addr, last_updated, attributes, per_recipient_headers, blob_ids, size"
    )

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.ENQUEUED_MAILS}"
        self._insert = session.prepare(f"INSERT INTO {t} ({self.COLUMNS}) VALUES ({', '.join('?' * 17)})")
        self._select = session.prepare(
            f"SELECT {self.COLUMNS} FROM {t} WHERE queue_name = ? AND slice_start = ? AND bucket = ?"
        )

    async def insert(self, q: model.QueuedMail) -> None:
        m = q.mail
        # The sender is always written: "" is the null sender, a value, not an absent cell.
        await execute(
            self._session,
            self._insert,
            (
                q.queue, q.slice_start, q.bucket, q.enqueued_at, q.enqueue_id,
                _unset_if_empty(m.name), m.sender, list(m.recipients),
                _unset_if_empty(m.state), _unset_if_empty(m.error_message),
                _unset_if_empty(m.remote_host), _unset_if_empty(m.remote_addr),
                m.last_updated if m.last_updated is not None else UNSET_VALUE,
                _unset_if_empty(m.attributes),
                _unset_if_empty([(p.recipient, h.name, h.value) for p in m.per_recipient_headers for h in p.headers]),
                _unset_if_empty(list(q.blob_ids)), q.size,
            ),
        )

    async def read_slice(self, queue: str, slice_start: dt.datetime, bucket: int) -> list[model.QueuedMail]:
        """Every row of one partition, in enqueue order."""
        rows = await execute_all(self._session, self._select, (queue, slice_start, bucket))
        return [self.to_domain(r) for r in rows]

    @staticmethod
    def to_domain(r: Any) -> model.QueuedMail:
        headers: dict[str, list[model.Header]] = {}
        for recipient, name, value in r.per_recipient_headers or ():
            headers.setdefault(recipient, []).append(model.Header(name, value))
        utc = dt.timezone.utc
        return model.QueuedMail(
            queue=r.queue_name,
            enqueue_id=r.enqueue_id,
            enqueued_at=r.enqueued_at.replace(tzinfo=utc),
            mail=model.Mail(
                name=r.name or "",
                sender=r.sender or "",
                recipients=tuple(r.recipients or ()),
                state=r.state or "",
                error_message=r.error_message or "",
                remote_host=r.remote_host or "",
                remote_addr=r.remote_addr or "",
                last_updated=r.last_updated.replace(tzinfo=utc) if r.last_updated else None,
                attributes=dict(r.attributes or {}),
                per_recipient_headers=tuple(model.PerRecipientHeaders(k, tuple(v)) for k, v in headers.items()),
            ),
            blob_ids=tuple(r.blob_ids or ()),
            size=r.size or 0,
            slice_start=r.slice_start.replace(tzinfo=utc),
            bucket=r.bucket,
        )


class DeletedMailsDAO:
    """``deleted_mails``: "this mail is gone"."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.DELETED_MAILS}"
        self._mark = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, ?, ?)"
        )
        self._get = session.prepare(f"SELECT reason FROM {t} WHERE queue_name = ? AND enqueue_id = ?")

    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str) -> None:
        await execute(self._session, self._mark, (queue, enqueue_id, reason, model.utcnow()))

    async def reason(self, queue: str, enqueue_id: uuid.UUID) -> str | None:
        """Why the mail is gone, or None while it is live."""
        rows = await execute(self._session, self._get, (queue, enqueue_id))
        return (rows[0].reason or "deleted") if rows else None


class StartsDAO:
    """``browse_start`` and ``content_start``: one instant per queue each."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        b, c = f"{keyspace}.{schema.BROWSE_START}", f"{keyspace}.{schema.CONTENT_START}"
        self._init_browse = session.prepare(
            f"INSERT INTO {b} (queue_name, browse_start) VALUES (?, ?) IF NOT EXISTS"
        )
        self._init_content = session.prepare(
            f"INSERT INTO {c} (queue_name, content_start) VALUES (?, ?) IF NOT EXISTS"
        )
        self._get_browse = session.prepare(f"SELECT browse_start FROM {b} WHERE queue_name = ?")
        self._get_content = session.prepare(f"SELECT content_start FROM {c} WHERE queue_name = ?")
        self._set_browse = session.prepare(f"UPDATE {b} SET browse_start = ? WHERE queue_name = ?")
        self._advance_content = session.prepare(
            f"UPDATE {c} SET content_start = ? WHERE queue_name = ? IF content_start = ?"
        )

    async def initialise(self, queue: str, start: dt.datetime) -> None:
        await execute(self._session, self._init_browse, (queue, start))
        await execute(self._session, self._init_content, (queue, start))

    async def browse_start(self, queue: str) -> dt.datetime | None:
        rows = await execute(self._session, self._get_browse, (queue,))
        return rows[0].browse_start.replace(tzinfo=dt.timezone.utc) if rows and rows[0].browse_start else None

    async def content_start(self, queue: str) -> dt.datetime | None:
        rows = await execute(self._session, self._get_content, (queue,))
        return rows[0].content_start.replace(tzinfo=dt.timezone.utc) if rows and rows[0].content_start else None

    async def set_browse_start(self, queue: str, start: dt.datetime) -> None:
        await execute(self._session, self._set_browse, (start, queue))

    async def advance_content_start(self, queue: str, start: dt.datetime) -> dt.datetime:
        """Move content start forward to ``start`` (never back), with a lightweight transaction
        so that two sweeps racing cannot move it backwards. Returns the content start in force."""
        while True:
            current = await self.content_start(queue)
            if current is not None and current >= start:
                return current
            rows = await execute(self._session, self._advance_content, (start, queue, current))
            if rows and rows[0][0]:
                return start


class QueuesDAO:
    """``queues``: the set of queues."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.QUEUES}"
        self._create = session.prepare(f"INSERT INTO {t} (queue_name, created_at) VALUES (?, ?) IF NOT EXISTS")
        self._exists = session.prepare(f"SELECT queue_name FROM {t} WHERE queue_name = ?")
        self._all = f"SELECT queue_name FROM {t}"

    async def create(self, queue: str) -> bool:
        """True when the queue is new."""
        rows = await execute(self._session, self._create, (queue, model.utcnow()))
        return bool(rows and rows[0].applied)

    async def exists(self, queue: str) -> bool:
        return bool(await execute(self._session, self._exists, (queue,)))

    async def all(self) -> list[str]:
        return sorted(r.queue_name for r in await execute_all(self._session, self._all))


class IdempotencyDAO:
    """``enqueue_idempotency``: a client key claims one enqueue id, committed once durable."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.IDEMPOTENCY}"
        self._claim = session.prepare(
            f"INSERT INTO {t} (queue_name, idempotency_key, enqueue_id, claimed_at, committed) "
            "VALUES (?, ?, ?, ?, false) IF NOT EXISTS"
        )
        self._take_over = session.prepare(
            f"UPDATE {t} SET claimed_at = ? WHERE queue_name = ? AND idempotency_key = ? "
            "IF committed = false AND claimed_at = ?"
        )
        self._commit = session.prepare(
            f"UPDATE {t} SET committed = true, enqueued_at = ?, blob_ids = ?, size = ? "
            "WHERE queue_name = ? AND idempotency_key = ?"
        )
        self._release = session.prepare(
            f"DELETE FROM {t} WHERE queue_name = ? AND idempotency_key = ? IF enqueue_id = ?"
        )

    async def claim(self, queue: str, key: str, enqueue_id: uuid.UUID, now: dt.datetime) -> Any | None:
        """Claim ``key`` for ``enqueue_id``. None when claimed; otherwise the existing row."""
        rows = await execute(self._session, self._claim, (queue, key, enqueue_id, now))
        return None if rows[0].applied else rows[0]

    async def take_over(self, queue: str, key: str, now: dt.datetime, seen: dt.datetime) -> bool:
        """Take over an abandoned, uncommitted claim (its enqueuer crashed), keeping its enqueue id."""
        rows = await execute(self._session, self._take_over, (now, queue, key, seen))
        return bool(rows[0].applied)

    async def commit(self, queue: str, key: str, q: model.QueuedMail) -> None:
        await execute(self._session, self._commit, (q.enqueued_at, _unset_if_empty(list(q.blob_ids)), q.size, queue, key))

    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID) -> None:
        await execute(self._session, self._release, (queue, key, enqueue_id))

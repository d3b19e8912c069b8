"""``enqueued_mails``: the time series of queued mails, one partition per (queue, slice, bucket).

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from cassandra import InvalidRequest, ReadFailure
from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE
from prometheus_client import Counter

from services.adapters.cassandra import schema
from services.adapters.cassandra.cells import from_ms, unset_if_empty
from services.adapters.cassandra.group_commit import GroupCommit
from services.adapters.cassandra.session import execute_all, execute_page
from services.domain import model

log = logging.getLogger(__name__)

UNDECODABLE = Counter(
    "mailqueue_view_rows_undecodable_total", "enqueued_mails rows skipped because a value could not be read", ["queue"],
)


class EnqueuedMailsDAO:
    """``enqueued_mails``: the time series, one partition per (queue, slice, bucket)."""

    COLUMNS = (
        "queue_name, slice_start, bucket, enqueued_at, enqueue_id, name, sender, recipients, state, error_message, "
        "remote_host, remote_addr, last_updated, attributes, per_recipient_headers, blob_ids, size, deliver_at, priority, traceparent"
    )
    #: What reads select: client-given instants as milliseconds (see from_ms).
    READ_COLUMNS = COLUMNS.replace("last_updated", "toUnixTimestamp(last_updated) AS last_updated_ms").replace(
        "deliver_at", "toUnixTimestamp(deliver_at) AS deliver_at_ms")

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        self._keyspace = keyspace
        t = f"{keyspace}.{schema.ENQUEUED_MAILS}"
        self._insert = session.prepare(f"INSERT INTO {t} ({self.COLUMNS}) VALUES ({', '.join('?' * 20)})")
        self._group = GroupCommit(session)
        self._select = session.prepare(
            f"SELECT {self.READ_COLUMNS} FROM {t} WHERE queue_name = ? AND slice_start = ? AND bucket = ?"
        )
        # The rows after a position (a page token's): a clustering range, read from there on.
        self._select_after = session.prepare(
            f"SELECT {self.READ_COLUMNS} FROM {t} WHERE queue_name = ? AND slice_start = ? AND bucket = ? "
            "AND (enqueued_at, enqueue_id) > (?, ?)"
        )
        # A column's index (schema.INDEXED) finds its rows in every queue; the queue filters those
        # few (ALLOW FILTERING reads what the index returned, not the table).
        self._indexed = {
            column: (index, session.prepare(
                f"SELECT {self.READ_COLUMNS} FROM {t} WHERE {column} = ? AND queue_name = ? ALLOW FILTERING"))
            for index, column in schema.INDEXED.items()
        }

    async def insert(self, q: model.QueuedMail) -> None:
        """Rows of one partition written at about the same time share one request (group_commit.py)."""
        m = q.mail
        # The sender is always written: "" is the null sender, a value, not an absent cell.
        await self._group.execute(
            (q.queue, q.slice_start, q.bucket),
            self._insert,
            (
                q.queue, q.slice_start, q.bucket, q.enqueued_at, q.enqueue_id,
                unset_if_empty(m.name), m.sender, list(m.recipients),
                unset_if_empty(m.state), unset_if_empty(m.error_message),
                unset_if_empty(m.remote_host), unset_if_empty(m.remote_addr),
                m.last_updated if m.last_updated is not None else UNSET_VALUE,
                unset_if_empty(m.attributes),
                unset_if_empty([(p.recipient, h.name, h.value) for p in m.per_recipient_headers for h in p.headers]),
                unset_if_empty(list(q.blob_ids)), q.size,
                q.deliver_at if q.deliver_at is not None else UNSET_VALUE,
                q.priority if q.priority != "normal" else UNSET_VALUE,
                unset_if_empty(q.traceparent),
            ),
        )

    async def read_slice(self, queue: str, slice_start: dt.datetime, bucket: int) -> list[model.QueuedMail]:
        """Every row of one partition, in enqueue order."""
        return self._decode(queue, await execute_all(self._session, self._select, (queue, slice_start, bucket)))

    async def indexed(self, queue: str, column: str, value: Any) -> list[model.QueuedMail] | None:
        """The queue's rows whose ``column`` (name or enqueue_id) is ``value``, from its index (any
        order); None while the index is missing or still being built (an older keyspace before its
        schema step)."""
        index, statement = self._indexed[column]
        ks = self._session.cluster.metadata.keyspaces.get(self._keyspace)
        table_meta = ks.tables.get(schema.ENQUEUED_MAILS) if ks is not None else None
        if table_meta is None or index not in table_meta.indexes:
            return None
        try:
            rows = await execute_all(self._session, statement, (value, queue))
        except (InvalidRequest, ReadFailure) as e:
            log.warning("the %s index cannot answer yet (%s): scanning", column, e)
            return None
        return self._decode(queue, rows)

    async def read_page(
        self, queue: str, slice_start: dt.datetime, bucket: int, fetch: int, paging_state: bytes | None,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> tuple[list[model.QueuedMail], bytes | None]:
        """Up to ``fetch`` rows of one partition in enqueue order, from ``paging_state`` (None: the
        first); and the paging state of the rest (None: no more rows). ``after``: only the rows
        after this (enqueued_at, enqueue_id), read from there (the same for every page of a read)."""
        statement, params = ((self._select, (queue, slice_start, bucket)) if after is None
                             else (self._select_after, (queue, slice_start, bucket, *after)))
        rows, state = await execute_page(self._session, statement, params, fetch, paging_state)
        return self._decode(queue, rows), state

    def _decode(self, queue: str, rows: list[Any]) -> list[model.QueuedMail]:
        mails = []
        for r in rows:
            try:
                mails.append(self.to_domain(r))
            except (ValueError, OverflowError, TypeError) as e:
                # One bad row must not make its queue unreadable: skipped, logged, counted.
                UNDECODABLE.labels(queue).inc()
                log.error("undecodable view row skipped: %s", e, extra={"queue": queue, "enqueue_id": str(r.enqueue_id)})
        return mails

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
                last_updated=from_ms(r.last_updated_ms),
                attributes=dict(r.attributes or {}),
                per_recipient_headers=tuple(model.PerRecipientHeaders(k, tuple(v)) for k, v in headers.items()),
            ),
            blob_ids=tuple(r.blob_ids or ()),
            size=r.size or 0,
            slice_start=r.slice_start.replace(tzinfo=utc),
            bucket=r.bucket,
            deliver_at=from_ms(r.deliver_at_ms),
            priority=r.priority or "normal",
            traceparent=r.traceparent or "",
        )

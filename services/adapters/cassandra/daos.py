"""One DAO per table of the view. Each takes and returns domain objects; all calls are async."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from typing import Any

from cassandra import InvalidRequest, ReadFailure
from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE
from prometheus_client import Counter

from services.adapters.cassandra import schema
from services.adapters.cassandra.group_commit import GroupCommit
from services.adapters.cassandra.group_read import GroupRead
from services.adapters.cassandra.session import execute, execute_all, execute_page
from services.domain import model

log = logging.getLogger(__name__)

UNDECODABLE = Counter(
    "mailqueue_view_rows_undecodable_total", "enqueued_mails rows skipped because a value could not be read", ["queue"],
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_UTC = dt.timezone.utc


def _from_ms(ms: int | None) -> dt.datetime | None:
    """Milliseconds since the epoch (read with toUnixTimestamp: the driver's own decoding of an
    extreme timestamp can fail for the whole page) as an aware datetime."""
    return None if ms is None else _EPOCH + dt.timedelta(milliseconds=ms)


def _micros(at: dt.datetime) -> int:
    """A Cassandra write timestamp (microseconds since the epoch)."""
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return value.replace(tzinfo=_UTC) if value is not None else None


def _unset_if_empty(value: Any) -> Any:
    """Absent values are left unset, never written as null (a null cell is a tombstone)."""
    return value if value not in (None, "", [], {}, ()) else UNSET_VALUE


class EnqueuedMailsDAO:
    """``enqueued_mails``: the time series, one partition per (queue, slice, bucket)."""

    COLUMNS = (
        "queue_name, slice_start, bucket, enqueued_at, enqueue_id, name, sender, recipients, state, error_message, "
        "remote_host, remote_addr, last_updated, attributes, per_recipient_headers, blob_ids, size, deliver_at, priority, traceparent"
    )
    #: What reads select: client-given instants as milliseconds (see _from_ms).
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
                _unset_if_empty(m.name), m.sender, list(m.recipients),
                _unset_if_empty(m.state), _unset_if_empty(m.error_message),
                _unset_if_empty(m.remote_host), _unset_if_empty(m.remote_addr),
                m.last_updated if m.last_updated is not None else UNSET_VALUE,
                _unset_if_empty(m.attributes),
                _unset_if_empty([(p.recipient, h.name, h.value) for p in m.per_recipient_headers for h in p.headers]),
                _unset_if_empty(list(q.blob_ids)), q.size,
                q.deliver_at if q.deliver_at is not None else UNSET_VALUE,
                q.priority if q.priority != "normal" else UNSET_VALUE,
                _unset_if_empty(q.traceparent),
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
                last_updated=_from_ms(r.last_updated_ms),
                attributes=dict(r.attributes or {}),
                per_recipient_headers=tuple(model.PerRecipientHeaders(k, tuple(v)) for k, v in headers.items()),
            ),
            blob_ids=tuple(r.blob_ids or ()),
            size=r.size or 0,
            slice_start=r.slice_start.replace(tzinfo=utc),
            bucket=r.bucket,
            deliver_at=_from_ms(r.deliver_at_ms),
            priority=r.priority or "normal",
            traceparent=r.traceparent or "",
        )


class DeletedMailsDAO:
    """``deleted_mails``: "this mail is gone", or its schedule while it lives.

    A mark sets ``reason`` and ``deleted_at`` (the retention sweep tells marks by ``deleted_at``);
    a schedule change sets only the schedule columns, so it never hides nor revives a mark.
    """

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.DELETED_MAILS}"
        self._mark = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, ?, ?)"
        )
        self._mark_at = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"
        )
        self._unmark = session.prepare(
            f"DELETE reason, deleted_at FROM {t} USING TIMESTAMP ? WHERE queue_name = ? AND enqueue_id = ?"
        )
        self._schedule = session.prepare(
            f"UPDATE {t} SET generation = ?, deliver_at = ?, attempts = ?, last_error = ?, held_by = ? "
            "WHERE queue_name = ? AND enqueue_id = ?"
        )
        self._get_many = session.prepare(
            f"SELECT enqueue_id, reason, deleted_at, generation, deliver_at, attempts, last_error, held_by FROM {t} "
            "WHERE queue_name = ? AND enqueue_id IN ?"
        )
        self._reads = GroupRead(self._fetch)

    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        """Mark the mail gone. ``written_at``: the mark's write time in Cassandra (last write
        wins), for an undo that must lose against a later ``unmark`` even when it lands later."""
        if written_at is None:
            await execute(self._session, self._mark, (queue, enqueue_id, reason, model.utcnow()))
        else:
            await execute(self._session, self._mark_at, (queue, enqueue_id, reason, written_at, _micros(written_at)))

    async def unmark(self, queue: str, enqueue_id: uuid.UUID, at: dt.datetime) -> None:
        """Remove a mark written before ``at`` (one written after it stays)."""
        await execute(self._session, self._unmark, (_micros(at), queue, enqueue_id))

    async def schedule(self, q: model.QueuedMail) -> None:
        """Record the mail's new schedule (generation, deliver_at, attempts, last error)."""
        # Empty values stay unset (no null cells): a held_by left from an earlier hold only counts
        # while its rule is in force and the mail is not yet due (services/domain/rules.py).
        await execute(self._session, self._schedule, (
            q.generation, q.due(), q.attempts, _unset_if_empty(q.last_error),
            q.held_by if q.held_by is not None else UNSET_VALUE, q.queue, q.enqueue_id,
        ))

    async def _fetch(self, queue: str, enqueue_ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
        rows = await execute(self._session, self._get_many, (queue, enqueue_ids))
        return {r.enqueue_id: r for r in rows}

    async def state(self, queue: str, enqueue_id: uuid.UUID) -> model.MailState | None:
        """The mail's mark or schedule; None when the view has neither (live, as enqueued).
        Reads that meet in time share one request (services/adapters/cassandra/group_read.py)."""
        r = await self._reads.get(queue, enqueue_id)
        if r is None:
            return None
        gone = r.deleted_at is not None or r.reason is not None
        return model.MailState(
            reason=(r.reason or "deleted") if gone else None, generation=r.generation or 0,
            deliver_at=_utc(r.deliver_at), attempts=r.attempts or 0, last_error=r.last_error or "", held_by=r.held_by,
        )


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
        self._delete = session.prepare(f"DELETE FROM {t} WHERE queue_name = ? IF EXISTS")
        dropped = f"{keyspace}.{schema.DROPPED_QUEUES}"
        self._drop = session.prepare(f"INSERT INTO {dropped} (queue_name, dropped_at) VALUES (?, ?)")
        self._undrop = session.prepare(f"DELETE FROM {dropped} WHERE queue_name = ?")
        self._is_dropped = session.prepare(f"SELECT queue_name FROM {dropped} WHERE queue_name = ?")
        self._all_dropped = f"SELECT queue_name FROM {dropped}"

    async def create(self, queue: str) -> bool:
        """True when the queue is new."""
        rows = await execute(self._session, self._create, (queue, model.utcnow()))
        return bool(rows and rows[0].applied)

    async def exists(self, queue: str) -> bool:
        return bool(await execute(self._session, self._exists, (queue,)))

    async def all(self) -> list[str]:
        return sorted(r.queue_name for r in await execute_all(self._session, self._all))

    async def drop(self, queue: str) -> None:
        """Recorded as dropped (for the retention sweep), then no longer listed nor accepting mail."""
        await execute(self._session, self._drop, (queue, model.utcnow()))
        await execute(self._session, self._delete, (queue,))

    async def restore(self, queue: str) -> None:
        """Undo ``drop`` (a delete refused after it)."""
        await execute(self._session, self._create, (queue, model.utcnow()))
        await execute(self._session, self._undrop, (queue,))

    async def dropped(self, queue: str) -> bool:
        return bool(await execute(self._session, self._is_dropped, (queue,)))

    async def all_dropped(self) -> list[str]:
        return sorted(r.queue_name for r in await execute_all(self._session, self._all_dropped))


class RetryPoliciesDAO:
    """``retry_policies``: one row per queue that does not use the defaults."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.RETRY_POLICIES}"
        self._set = session.prepare(
            f"INSERT INTO {t} (queue_name, initial_backoff_ms, multiplier, max_backoff_ms, max_attempts, max_age_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        self._get = session.prepare(
            f"SELECT initial_backoff_ms, multiplier, max_backoff_ms, max_attempts, max_age_ms FROM {t} WHERE queue_name = ?"
        )
        self._delete = session.prepare(f"DELETE FROM {t} WHERE queue_name = ?")

    async def set(self, queue: str, p: model.RetryPolicy) -> None:
        ms = lambda d: int(d / dt.timedelta(milliseconds=1))  # noqa: E731
        await execute(self._session, self._set, (
            queue, ms(p.initial_backoff), p.multiplier, ms(p.max_backoff), p.max_attempts, ms(p.max_age),
        ))

    async def delete(self, queue: str) -> None:
        await execute(self._session, self._delete, (queue,))

    async def get(self, queue: str) -> model.RetryPolicy:
        rows = await execute(self._session, self._get, (queue,))
        if not rows:
            return model.RetryPolicy()
        r = rows[0]
        return model.RetryPolicy(
            initial_backoff=dt.timedelta(milliseconds=r.initial_backoff_ms), multiplier=r.multiplier,
            max_backoff=dt.timedelta(milliseconds=r.max_backoff_ms), max_attempts=r.max_attempts,
            max_age=dt.timedelta(milliseconds=r.max_age_ms),
        )


class RulesDAO:
    """``rules``: the operators' hold and bounce rules, one partition, TTL to each rule's expiry."""

    SCOPE = "all"
    COLUMNS = "rule_id, kind, queue_name, recipient_domain, sender, name, reason, created_at, expires_at"

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.RULES}"
        self._add = session.prepare(f"INSERT INTO {t} (scope, {self.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        self._all = session.prepare(f"SELECT {self.COLUMNS} FROM {t} WHERE scope = ?")
        self._get = session.prepare(f"SELECT {self.COLUMNS} FROM {t} WHERE scope = ? AND rule_id = ?")
        self._lift = session.prepare(f"DELETE FROM {t} WHERE scope = ? AND rule_id = ?")

    async def add(self, r: model.Rule) -> None:
        ttl = max(1, int((r.expires_at - model.utcnow()).total_seconds()) + 1)
        await execute(self._session, self._add, (
            self.SCOPE, r.rule_id, r.kind, _unset_if_empty(r.queue), _unset_if_empty(r.recipient_domain),
            _unset_if_empty(r.sender), _unset_if_empty(r.name), _unset_if_empty(r.reason), r.created_at, r.expires_at, ttl,
        ))

    async def all(self) -> list[model.Rule]:
        rows = await execute_all(self._session, self._all, (self.SCOPE,))
        return sorted((self._domain(r) for r in rows), key=lambda r: r.created_at)

    async def get(self, rule_id: uuid.UUID) -> model.Rule | None:
        rows = await execute(self._session, self._get, (self.SCOPE, rule_id))
        return self._domain(rows[0]) if rows else None

    async def lift(self, rule_id: uuid.UUID) -> None:
        await execute(self._session, self._lift, (self.SCOPE, rule_id))

    @staticmethod
    def _domain(r: Any) -> model.Rule:
        return model.Rule(
            rule_id=r.rule_id, kind=r.kind, expires_at=_utc(r.expires_at), created_at=_utc(r.created_at),
            queue=r.queue_name or "", recipient_domain=r.recipient_domain or "", sender=r.sender or "",
            name=r.name or "", reason=r.reason or "",
        )


class CountersDAO:
    """``queue_counters``: per queue, per kind, per enqueue slice. Cassandra counters: an update
    that times out may or may not have applied, so they drift; ReconcileCounters heals them."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.COUNTERS}"
        self._add = session.prepare(f"UPDATE {t} SET count = count + ? WHERE queue_name = ? AND kind = ? AND slice_start = ?")
        self._read = session.prepare(
            f"SELECT slice_start, count FROM {t} WHERE queue_name = ? AND kind = ? AND slice_start >= ?")

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None:
        await execute(self._session, self._add, (delta, queue, kind, slice_start))

    async def read(self, queue: str, kinds: tuple[str, ...], since: dt.datetime) -> dict[str, dict[dt.datetime, int]]:
        """kind -> slice start -> count, for the slices from ``since`` (one partition, one range per kind:
        the queue's history before ``since`` is not read)."""
        parts = await asyncio.gather(*(execute_all(self._session, self._read, (queue, k, since)) for k in kinds))
        return {k: {_utc(r.slice_start): r.count for r in rows} for k, rows in zip(kinds, parts)}


class IdempotencyDAO:
    """``enqueue_idempotency``: a client key claims one enqueue id, committed once durable. An
    uncommitted claim names its owner, the lease (``enqueuers``) of the process whose attempt holds it."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.IDEMPOTENCY}"
        self._claim = session.prepare(
            f"INSERT INTO {t} (queue_name, idempotency_key, enqueue_id, claimed_at, committed, owner) "
            "VALUES (?, ?, ?, ?, false, ?) IF NOT EXISTS"
        )
        self._take_over = session.prepare(
            f"UPDATE {t} SET claimed_at = ?, owner = ? WHERE queue_name = ? AND idempotency_key = ? "
            "IF committed = false AND claimed_at = ?"
        )
        self._commit = session.prepare(
            f"UPDATE {t} SET committed = true, enqueued_at = ?, blob_ids = ?, size = ? "
            "WHERE queue_name = ? AND idempotency_key = ?"
        )
        self._release = session.prepare(
            f"DELETE FROM {t} WHERE queue_name = ? AND idempotency_key = ? IF enqueue_id = ? AND claimed_at = ?"
        )

    async def claim(self, queue: str, key: str, enqueue_id: uuid.UUID, now: dt.datetime,
                    owner: uuid.UUID | None = None) -> model.IdempotencyClaim | None:
        """Claim ``key`` for ``enqueue_id`` (by ``owner``). None when claimed; otherwise who holds it."""
        rows = await execute(self._session, self._claim, (queue, key, enqueue_id, now, _unset_if_empty(owner)))
        r = rows[0]
        if r.applied:
            return None
        result = None
        if r.committed:
            result = model.EnqueueResult(r.enqueue_id, _utc(r.enqueued_at), tuple(r.blob_ids or ()), r.size or 0, duplicate=True)
        return model.IdempotencyClaim(r.enqueue_id, _utc(r.claimed_at), result, getattr(r, "owner", None))

    async def take_over(self, queue: str, key: str, now: dt.datetime, seen: dt.datetime,
                        owner: uuid.UUID | None = None) -> bool:
        """Take over an abandoned, uncommitted claim (its enqueuer crashed or failed), keeping its
        enqueue id: a copy the abandoned attempt published is then the same mail. ``owner`` holds it now."""
        rows = await execute(self._session, self._take_over, (now, _unset_if_empty(owner), queue, key, seen))
        r = rows[0]
        # Not applied, but to our time: a retry by the driver of a take-over that had applied.
        return bool(r.applied) or _utc(getattr(r, "claimed_at", None)) == now

    async def commit(self, queue: str, key: str, q: model.QueuedMail) -> None:
        await execute(self._session, self._commit, (q.enqueued_at, _unset_if_empty(list(q.blob_ids)), q.size, queue, key))

    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID, claimed_at: dt.datetime) -> None:
        """Release the claim this attempt made (a claim taken over since then is left alone)."""
        await execute(self._session, self._release, (queue, key, enqueue_id, claimed_at))

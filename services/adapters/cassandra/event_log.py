"""The mail history in Cassandra (services/ports/events.py ``EventLog``), and the sinks after it.

Storage (services/adapters/cassandra/schema.py):

- ``mail_history_v1``: one partition per enqueue id, one row per event id. Reading a mail's
  history is one partition read, whatever the queue's depth or the history's size; an event
  written twice (a change carried out again after a crash) overwrites its own row.
- ``mail_history_names_v1``: name -> (time, enqueue id), written with each ENQUEUED event and with
  each MOVED or REDRIVEN one (for the id the mail landed under), newest first: a history by name
  reads that partition (at most ``limit`` mails), then each mail's.

Bounded by TTL, not by a sweep: every row is written ``USING TTL`` the history retention
(MAILQUEUE_HISTORY_RETENTION_S). A sweep would delete rows, and each delete is a tombstone that
reads must skip until compaction purges it after gc_grace; a TTL'd row expires in place. The
tables use TimeWindowCompactionStrategy with day windows: rows written on one day share SSTables
that expire together and are dropped whole, unread, once their last row has expired, so expired
history is never read or compacted row by row. A history partition is written a few times
within a mail's life and read rarely: exactly the pattern TWCS serves (no overwrite across
windows beyond a mail's retries).

Batching: ``record`` calls that meet in one event-loop turn share requests. Their rows leave as
UNLOGGED batches of at most ``BATCH_STATEMENTS`` statements and about ``BATCH_BYTES`` (under
Cassandra's cross-partition (10) and size (5 KiB) warning thresholds: each batch spans
partitions), all sent at once: never a round trip per event. Each caller waits for the batches
holding its rows, and gets BackendUnavailable if one failed.

Composition: after the history, ``record`` awaits each extra sink given at construction (the
event stream), in order; it returns once every sink has taken the events. (Both at once was
measured: no gain in the events bench, 0.84 and 0.73 either way, and a Cassandra outage would then
leave in the stream events of changes never carried out.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import socket
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType
from prometheus_client import Histogram

from services.adapters.cassandra.schema import MAIL_HISTORY, MAIL_HISTORY_NAMES
from services.adapters.cassandra.session import execute
from services.adapters.cassandra.statement_kinds import batch_kind
from services.domain.events import Actor, Event, EventType, landed_id, ordered, text_bytes

#: Statements per request at most (Cassandra warns past 10 partitions in an unlogged batch).
BATCH_STATEMENTS = 8
#: Bytes of values per request, about (Cassandra warns past a 5 KiB batch).
BATCH_BYTES = 4000

BATCH_SIZE = Histogram(
    "mailqueue_event_batch_statements", "Statements per history write request (events of concurrent callers share one)",
    buckets=(1, 2, 4, 8),
)


class EventSink(Protocol):
    """Somewhere else events go after the history (the event stream): ``record`` returns once they are taken."""

    async def record(self, events: Sequence[Event]) -> None: ...


_Row = tuple[Any, tuple[Any, ...], int]
_Waiting = tuple[list[_Row], "asyncio.Future[None]"]


class CassandraEventLog:
    def __init__(self, session: Session, keyspace: str, retention_s: int, replica: str = "",
                 sinks: Sequence[EventSink] = ()) -> None:
        self._session = session
        self._ttl = retention_s
        self._sinks = tuple(sinks)
        #: The process that records (host name and service) when an event names none.
        self.replica = replica or socket.gethostname()
        self._insert = session.prepare(
            f"INSERT INTO {keyspace}.{MAIL_HISTORY} (enqueue_id, event_id, at, type, queue_name, name, sender, attempt, "
            "reason, replica, actor_kind, actor_role, actor_identity, traceparent, details) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        )
        self._insert_name = session.prepare(
            f"INSERT INTO {keyspace}.{MAIL_HISTORY_NAMES} (name, at, enqueue_id, queue_name) VALUES (?, ?, ?, ?) USING TTL ?"
        )
        self._select = session.prepare(f"SELECT * FROM {keyspace}.{MAIL_HISTORY} WHERE enqueue_id = ?")
        self._select_names = session.prepare(
            f"SELECT enqueue_id FROM {keyspace}.{MAIL_HISTORY_NAMES} WHERE name = ? LIMIT ?"
        )
        self._waiting: list[_Waiting] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ writing
    async def record(self, events: Sequence[Event]) -> None:
        """Durable in the history, then taken by each sink; BackendUnavailable otherwise. In that
        order, not at once: a history that cannot be written (Cassandra down) leaves nothing in
        the stream either, so a change that is then not carried out has no event anywhere."""
        rows = [row for e in events if e.enqueue_id is not None for row in self._rows(e)]
        if rows:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[None] = loop.create_future()
            done.add_done_callback(_retrieved)
            self._waiting.append((rows, done))
            if not self._scheduled:
                self._scheduled = True
                loop.call_soon(self._send)
            await asyncio.shield(done)  # a cancelled caller does not cancel the others' batches
        for sink in self._sinks:
            await sink.record(events)

    def _rows(self, e: Event) -> list[_Row]:
        # Absent values are left unset, never null (a null cell is a tombstone).
        values = (e.enqueue_id, e.id, e.time, e.type.value, *map(_set, (e.queue, e.name, e.sender)), e.attempt,
                  *map(_set, (e.reason, e.replica or self.replica, e.actor.kind, e.actor.role, e.actor.identity,
                              e.traceparent, dict(e.details))), self._ttl)
        size = 200 + text_bytes(e)
        rows: list[_Row] = [(self._insert, values, size)]
        if e.type is EventType.ENQUEUED and e.name:
            rows.append((self._insert_name, (e.name, e.time, e.enqueue_id, e.queue, self._ttl), 80 + len(e.name)))
        landed = landed_id(e)
        if landed is not None and e.name:  # the name's mails include the copy a move or redrive made
            rows.append((self._insert_name, (e.name, e.time, landed, e.details.get("to_queue", ""), self._ttl), 80 + len(e.name)))
        return rows

    def _send(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        batches: list[list[_Row]] = [[]]
        size = 0
        holding: list[list[int]] = []  # per caller, the batches that hold its rows
        for rows, _ in waiting:
            mine: list[int] = []
            for row in rows:
                if batches[-1] and (len(batches[-1]) >= BATCH_STATEMENTS or size + row[2] > BATCH_BYTES):
                    batches.append([])
                    size = 0
                batches[-1].append(row)
                size += row[2]
                if not mine or mine[-1] != len(batches) - 1:
                    mine.append(len(batches) - 1)
            holding.append(mine)
        loop = asyncio.get_running_loop()
        callers = [_Caller(done, len(mine)) for mine, (_, done) in zip(holding, waiting, strict=True)]
        held_by: list[list[_Caller]] = [[] for _ in batches]
        for mine, caller in zip(holding, callers, strict=True):
            for i in mine:
                held_by[i].append(caller)
        for batch, holders in zip(batches, held_by, strict=True):
            task = self._keep(loop.create_task(self._write(batch)))
            task.add_done_callback(functools.partial(_settle, holders=holders))

    def _keep(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write(self, rows: list[_Row]) -> None:
        BATCH_SIZE.observe(len(rows))
        if len(rows) == 1:
            statement, values, _ = rows[0]
            await execute(self._session, statement.bind(values))
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for statement, values, _ in rows:
            batch.add(statement, values)
        await execute(self._session, batch, kind=batch_kind(rows[0][0]))

    # ------------------------------------------------------------------ reading
    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        """The mail's events, oldest first: one partition read."""
        return ordered([_event(r) for r in await execute(self._session, self._select, (enqueue_id,))])

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        """The events of the (at most ``limit``, newest) mails of a name, oldest first."""
        rows = await execute(self._session, self._select_names, (name, limit))
        ids = list(dict.fromkeys(r.enqueue_id for r in rows))
        histories = await asyncio.gather(*(self.history(i) for i in ids))
        return ordered([e for h in histories for e in h])


def _event(r: Any) -> Event:
    return Event(
        id=r.event_id, time=r.at.replace(tzinfo=dt.timezone.utc), type=EventType(r.type),
        queue=r.queue_name or "", enqueue_id=r.enqueue_id, actor=Actor(r.actor_kind or "caller", r.actor_role or "", r.actor_identity or ""),
        name=r.name or "", sender=r.sender or "", attempt=r.attempt or 0, reason=r.reason or "", replica=r.replica or "",
        traceparent=r.traceparent or "", details=dict(r.details or {}),
    )


class _Caller:
    """A record call waiting for its batches: its answer is set when the last one is written, or
    when one failed."""

    __slots__ = ("done", "left")

    def __init__(self, done: asyncio.Future[None], batches: int) -> None:
        self.done, self.left = done, batches


def _settle(batch: asyncio.Task[None], holders: list[_Caller]) -> None:
    failed = None if batch.cancelled() else batch.exception()
    for c in holders:
        if c.done.done():
            continue
        if batch.cancelled():
            c.done.cancel()
        elif failed is not None:
            c.done.set_exception(failed)
        else:
            c.left -= 1
            if c.left == 0:
                c.done.set_result(None)


def _set(value: Any) -> Any:
    return value if value not in ("", {}) else UNSET_VALUE


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()

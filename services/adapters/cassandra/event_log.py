"""The mail history in Cassandra (services/ports/events.py ``EventLog``), and the sinks after it.

Storage (services/adapters/cassandra/schema.py):

- ``mail_history_groups_v1``: one partition per history key, the 96 bits the enqueue ids of one
  group share (services/domain/events.py); a row per write, holding that write's events of
  the key's mails as one ``mailqueue.v1.EventBatch``. The events of a change to many mails (a
  group enqueued, a batch handed out or answered) are one row per key, not one per event: the
  cost of the history is per write, not per mail. Reading a mail's history is one partition read
  (the key comes from the id), whatever the queue's depth or the history's size; an event
  written twice (a change carried out again after a crash) is kept once by its id.
- ``mail_history_v1``: one partition per enqueue id, one row per event: the retention sweep's
  events (spark/executors.py writes them there, a row each), and history recorded before the
  grouped table. A history reads both partitions at once.
- ``mail_history_name_days_v1``: (name, day) -> the history keys holding mails of that name, newest
  first: a row per write and key, written with the ENQUEUED events and with each MOVED or
  REDRIVEN one (for the key of the id the mail landed under). Mails of one name enqueued together
  are one row, and a name's rows are split by day, so a popular name (a campaign's) neither makes
  a row per mail nor a partition without bound. A history by name reads the retention's days at
  once, then the keys' partitions (at most ``limit``), keeping the events of that name.

Bounded by TTL, not by a sweep: every row is written ``USING TTL`` the history retention
(MAILQUEUE_HISTORY_RETENTION_S). A sweep would delete rows, and each delete is a tombstone that
reads must skip until compaction purges it after gc_grace; a TTL'd row expires in place. The
tables use TimeWindowCompactionStrategy with day windows: rows written on one day share SSTables
that expire together and are dropped whole, unread, once their last row has expired, so expired
history is never read or compacted row by row.

Batching: ``record`` calls that meet in one event-loop turn share requests: their events of one
history key are one row, and small rows leave as UNLOGGED batches of at most
``BATCH_STATEMENTS`` statements and about ``BATCH_BYTES`` (under Cassandra's cross-partition (10)
and size (5 KiB) warning thresholds), a larger row alone, all sent at once: never a round trip
per event. Each caller waits for the requests holding its rows, and gets BackendUnavailable if
one failed.

Composition: after the history, each extra sink given at construction (the event stream) takes
the events, in order; ``record`` returns once every sink has. The sinks are fed per loop turn, not
per caller: once a turn's rows are written, the events of its callers whose rows all were go to
each sink in one call, in the callers' order (a caller whose row failed gets BackendUnavailable
and has nothing in the stream). A caller waits on one future whatever the sinks: a delivered
mail's record is one suspension, not one per sink. (History and stream at once was measured: no
gain in the events bench, 0.84 and 0.73 either way, and a Cassandra outage would then leave in the
stream events of changes never carried out.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType
from cassandra.util import uuid_from_time
from prometheus_client import Histogram

from services.adapters.cassandra.schema import MAIL_HISTORY, MAIL_HISTORY_GROUPS, MAIL_HISTORY_NAMES
from services.adapters.cassandra.session import execute, execute_all
from services.adapters.cassandra.statement_kinds import batch_kind
from services.contract import events_serde
from services.domain import model
from services.domain.events import LANDINGS, Actor, Event, EventType, history_key, history_key_int, landed_id, ordered

log = logging.getLogger(__name__)

DAY_S = 86_400
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

    async def record(self, events: Sequence[Event], encoded: Sequence[bytes] | None = None) -> None: ...


_Row = tuple[Any, tuple[Any, ...], int]


class _Waiting:
    """One ``record`` call of the loop turn: its rows by history key and name, its events for the
    sinks, and the future its caller waits on."""

    __slots__ = ("keyed", "names", "events", "encoded", "done")

    def __init__(self, keyed: dict[int, list[bytes]], names: dict[tuple[str, int], dt.datetime],
                 events: Sequence[Event], encoded: Sequence[bytes], done: asyncio.Future[None]) -> None:
        self.keyed, self.names, self.events, self.encoded, self.done = keyed, names, events, encoded, done


class CassandraEventLog:
    def __init__(self, session: Session, keyspace: str, retention_s: int, replica: str = "",
                 sinks: Sequence[EventSink] = (), take_back: bool = True) -> None:
        self._session = session
        #: Whether a turn's rows are deleted when a sink fails (``_take_back``): not where the change
        #: is written with its event whatever the sinks (dequeue_svc: a SUCCESS's mark).
        self._taking_back = take_back
        self._ttl = retention_s
        self._days = retention_s // DAY_S + 2  # the days a name's rows can be in (and one of clock skew)
        self._sinks = tuple(sinks)
        #: The process that records (host name and service) when an event names none.
        self.replica = replica or socket.gethostname()
        self._insert_group = session.prepare(
            f"INSERT INTO {keyspace}.{MAIL_HISTORY_GROUPS} (history_key, written, events) VALUES (?, ?, ?) USING TTL ?"
        )
        #: A turn's rows taken back when a sink failed: its callers were answered with the error.
        self._delete_group = session.prepare(f"DELETE FROM {keyspace}.{MAIL_HISTORY_GROUPS} WHERE history_key = ? AND written = ?")
        self._insert_name = session.prepare(
            f"INSERT INTO {keyspace}.{MAIL_HISTORY_NAMES} (name, day, at, history_key) VALUES (?, ?, ?, ?) USING TTL ?"
        )
        self._select = session.prepare(f"SELECT * FROM {keyspace}.{MAIL_HISTORY} WHERE enqueue_id = ?")
        self._select_group = session.prepare(f"SELECT events FROM {keyspace}.{MAIL_HISTORY_GROUPS} WHERE history_key = ?")
        self._select_names = session.prepare(
            f"SELECT history_key FROM {keyspace}.{MAIL_HISTORY_NAMES} WHERE name = ? AND day = ? LIMIT ?"
        )
        self._waiting: list[_Waiting] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ writing
    async def record(self, events: Sequence[Event]) -> None:
        """Durable in the history, then taken by each sink; BackendUnavailable otherwise. In that
        order, not at once: a history that cannot be written (Cassandra down) leaves nothing in
        the stream either, so a change that is then not carried out has no event anywhere."""
        if not events:
            return
        encoded = events_serde.encode_each(events, self.replica)  # once, for the history and the stream
        keyed: dict[int, list[bytes]] = {}  # history keys as integers (history_key_int)
        names: dict[tuple[str, int], dt.datetime] = {}  # (name, history key) -> when
        mail, key = None, None
        for e, body in zip(events, encoded, strict=True):
            if e.enqueue_id is None:
                continue
            if e.enqueue_id != mail:  # a delivery's two events are one mail's: one key
                mail, key = e.enqueue_id, history_key_int(e.enqueue_id)
            keyed.setdefault(key, []).append(body)
            if e.name and e.type is EventType.ENQUEUED:
                names.setdefault((e.name, key), e.time)
            if e.type in LANDINGS and e.name:  # the name's mails include the copy a move or redrive made
                landed = landed_id(e)
                if landed is not None:
                    names.setdefault((e.name, history_key_int(landed)), e.time)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.add_done_callback(_retrieved)
        self._waiting.append(_Waiting(keyed, names, events, encoded, done))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        await done  # a cancelled caller cancels its own answer, never the writes others wait for

    def _send(self) -> None:
        """The events of every caller of this loop turn: one row per history key (callers that
        meet on a key share its row), plus the name rows; small rows packed into unlogged
        batches, a large one alone; then the sinks, once for the turn (``_commit``)."""
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        keyed: dict[int, tuple[list[bytes], list[int]]] = {}
        named: dict[tuple[str, int], tuple[dt.datetime, list[int]]] = {}
        for c, w in enumerate(waiting):
            for key, events in w.keyed.items():
                held = keyed.setdefault(key, ([], []))
                held[0].extend(events)
                held[1].append(c)
            for name_key, at in w.names.items():
                named.setdefault(name_key, (at, []))[1].append(c)
        rows: list[tuple[_Row, list[int]]] = []
        for (name, key), (at, callers) in named.items():
            rows.append(((self._insert_name, (name, day_of(at), at, uuid.UUID(int=key), self._ttl), 80 + len(name)), callers))
        for key, (encoded, callers) in keyed.items():
            body = events_serde.batch_of_encoded(encoded)
            # The write's time-based id made here (as now() would make it there), so the row can be
            # taken back if a sink fails (``_take_back``).
            written = uuid_from_time(time.time())
            rows.append(((self._insert_group, (uuid.UUID(int=key), written, body, self._ttl), 40 + len(body)), callers))
        requests: list[list[_Row]] = []
        holders: list[list[list[int]]] = []  # per request, each row's callers
        size = BATCH_BYTES
        for row, callers in rows:
            if len(requests[-1] if requests else ()) >= BATCH_STATEMENTS or size + row[2] > BATCH_BYTES:
                requests.append([])
                holders.append([])
                size = 0
            requests[-1].append(row)
            holders[-1].append(callers)
            size += row[2]
        self._keep(asyncio.get_running_loop().create_task(self._commit(waiting, requests, holders)))

    def _keep(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _commit(self, waiting: list[_Waiting], requests: list[list[_Row]], holders: list[list[list[int]]]) -> None:
        """A loop turn's writes, then its sinks; each caller answered with its own outcome (a
        cancelled commit, when the service stops, cancels every caller still waiting)."""
        try:
            await self._write_then_sink(waiting, requests, holders)
        finally:  # cancelled (the service stops): no caller waits for ever
            for w in waiting:
                if not w.done.done():
                    w.done.cancel()

    async def _write_then_sink(self, waiting: list[_Waiting], requests: list[list[_Row]], holders: list[list[list[int]]]) -> None:
        """The turn's requests, all at once; then the events of the callers whose rows were all
        written go to each sink in one call; each caller gets its row's failure, the sinks', or None.
        A caller whose rows were written in part (one request of its turn failed) is answered with
        the failure and carries its change out no further: its rows that were written are taken
        back, as when a sink fails."""
        failed: dict[int, BaseException] = {}
        results: list[BaseException | None] = []
        if len(requests) == 1:  # most turns: awaited here, no gather and no task of its own
            try:
                await self._write(requests[0])
                results = [None]
            except Exception as e:  # noqa: BLE001 - its callers get it
                results = [e]
        elif requests:
            results = await asyncio.gather(*(self._write(r) for r in requests), return_exceptions=True)
        for result, held in zip(results, holders, strict=True):
            if isinstance(result, BaseException):
                for callers in held:
                    for c in callers:
                        failed.setdefault(c, result)
        if failed and self._taking_back:
            await self._take_back(requests, results, holders, set(failed))
        written = [w for c, w in enumerate(waiting) if c not in failed]
        sunk: BaseException | None = None
        if written and self._sinks:
            events = [e for w in written for e in w.events]
            encoded = [b for w in written for b in w.encoded]
            try:
                for sink in self._sinks:
                    await sink.record(events, encoded)
            except BaseException as e:  # noqa: BLE001 - every caller of the turn gets it (cancelled: the service stops)
                sunk = e
                if self._taking_back and not isinstance(e, asyncio.CancelledError):
                    await self._take_back(requests, results, holders, set(range(len(waiting))))  # every caller fails
        for c, w in enumerate(waiting):
            error = failed.get(c, sunk)
            if w.done.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                w.done.cancel()
            elif error is not None:
                w.done.set_exception(error)
            else:
                w.done.set_result(None)
        if isinstance(sunk, asyncio.CancelledError):
            raise sunk

    async def _take_back(self, requests: list[list[_Row]], results: list[BaseException | None],
                         holders: list[list[list[int]]], undone: set[int]) -> None:
        """The callers ``undone`` are answered with an error (a sink failed: the stream unreachable;
        or a request of theirs failed) and carry their changes out no further (an enqueue undone,
        an admin change not applied), so the history rows written for them alone are deleted: the
        history says nothing of a change that did not happen (a row shared with a caller whose
        change goes on stays). Not in dequeue_svc (``take_back`` False): a SUCCESS's mark is
        written with its event, so the change is done; its event is written again when the mail
        comes back and is skipped. Best effort, on this rare path only (a delete is a tombstone): if it fails too,
        logged, and the rows expire with the retention."""
        groups = [values for request, result, held in zip(requests, results, holders, strict=True) if result is None
                  for (statement, values, _), callers in zip(request, held, strict=True)
                  if statement is self._insert_group and undone.issuperset(callers)]
        if not groups:
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for key, written, *_ in groups:
            batch.add(self._delete_group, (key, written))
        try:
            await execute(self._session, batch, kind=batch_kind(self._delete_group))
        except Exception as e:  # noqa: BLE001 - the caller's error is the sink's
            log.warning("could not take back the history of a change the event stream refused: %s", e,
                        extra={"rows": len(groups)})

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
        """The mail's events, oldest first: its history key's partition (the events the services
        recorded), and its own partition of the per-event table (the sweep's), read at once; an
        event written twice is kept once."""
        grouped, single = await asyncio.gather(
            execute_all(self._session, self._select_group, (history_key(enqueue_id),)),  # a row per write: may be pages
            execute(self._session, self._select, (enqueue_id,)),
        )
        mine = str(enqueue_id)
        found = {e.id: e for r in grouped for e in _events_of(r.events, enqueue_id=mine)}
        found.update((e.id, e) for e in map(_event, single))
        return ordered(list(found.values()))

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        """The events of the (at most ``limit``, newest) mails of a name, oldest first: the name's
        days of the retention, read at once; then the history keys they name (at most ``limit``);
        then the sweep's events of those mails."""
        today = day_of(model.utcnow())
        days = await asyncio.gather(*(execute(self._session, self._select_names, (name, today - d, limit))
                                      for d in range(-1, self._days)))  # from tomorrow: a writer's clock ahead
        keys = list(dict.fromkeys(r.history_key for rows in days for r in rows))[:limit]
        parts = await asyncio.gather(*(execute_all(self._session, self._select_group, (k,)) for k in keys))
        found = {e.id: e for rows in parts for r in rows for e in _events_of(r.events, name=name)}
        first: dict[uuid.UUID, dt.datetime] = {}
        for e in found.values():
            if e.enqueue_id is not None and (e.enqueue_id not in first or e.time < first[e.enqueue_id]):
                first[e.enqueue_id] = e.time
        mails = sorted(first, key=lambda i: first[i], reverse=True)[:limit]
        singles = await asyncio.gather(*(execute(self._session, self._select, (i,)) for i in mails))
        kept = set(mails)
        events = {i: e for i, e in found.items() if e.enqueue_id in kept}
        events.update((e.id, e) for rows in singles for e in map(_event, rows))
        return ordered(list(events.values()))


def day_of(at: dt.datetime) -> int:
    """Days since the epoch (UTC): a name's partition of the day."""
    return int(at.timestamp()) // DAY_S


def _events_of(body: bytes, enqueue_id: str = "", name: str = "") -> list[Event]:
    """The events of a history row of one mail (``enqueue_id``) or of one name."""
    return events_serde.readable((("", pb) for pb in events_serde.batch_from_bytes(body)
                                  if (pb.enqueue_id == enqueue_id if enqueue_id else pb.name == name)), _unreadable)


def _unreadable(pb: Any, e: ValueError) -> None:
    log.warning("skipped an event of a history this version cannot read", extra={"event_id": pb.id, "error": str(e)[:200]})


def _event(r: Any) -> Event:
    return Event(
        id=r.event_id, time=r.at.replace(tzinfo=dt.timezone.utc), type=EventType(r.type),
        queue=r.queue_name or "", enqueue_id=r.enqueue_id, actor=Actor(r.actor_kind or "caller", r.actor_role or "", r.actor_identity or ""),
        name=r.name or "", sender=r.sender or "", attempt=r.attempt or 0, reason=r.reason or "", replica=r.replica or "",
        traceparent=r.traceparent or "", details=dict(r.details or {}),
    )


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()

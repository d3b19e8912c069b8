"""The mail queue view (services/ports/view.py: MailQueueView) on Cassandra's tables: the mail
rows, their deleted marks and schedules, browse start and the slice counters, through their DAOs
(one module per table: services/adapters/cassandra/enqueued_mails.py, deleted_mails.py, starts.py, counters.py).

A mark and the counter updates it makes go together here (``mark_gone``): the use-cases do not pair
them themselves. ``mark`` alone is for a mail whose counts changed already or never did (a dead
letter purged, an enqueue undone before it was counted). The updates are gathered in the process
(counter_buffer.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import uuid
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import Counter

from services.adapters.cassandra.counter_buffer import CounterBuffer
from services.adapters.cassandra.counters import CountersDAO
from services.adapters.cassandra.deleted_mails import DeletedMailsDAO
from services.adapters.cassandra.enqueued_mails import EnqueuedMailsDAO
from services.adapters.cassandra.starts import StartsDAO
from services.domain import counts, model, paging
from services.ports.view import MailQueueView

ROWS_READ = Counter("mailqueue_view_rows_read_total", "Rows read from enqueued_mails by browse-like operations", ["op"])
MARKS_READ = Counter("mailqueue_view_marks_read_total", "Deleted marks read by browse-like operations", ["op"])

#: Deleted marks checked at once per slice partition.
MARK_CONCURRENCY = 64
#: The largest page a lazy read asks one partition for (the driver's default fetch size).
MAX_PAGE = 5000
#: A heap entry that stands for a partition's next page, not yet read.
REFILL = -1


def _gone(q: model.QueuedMail, now: dt.datetime) -> dict[str, int]:
    """What a live mail marked gone at ``now`` takes off its slice's counters (the counter model:
    services/domain/counts.py): a mail still waiting for its delay (per its view row) also leaves
    the delayed (and held) counts, since its message will be skipped, not counted, when it arrives."""
    waiting = q.due() > now
    return {"gone": 1, "delayed": -1 if waiting else 0, "held": -1 if waiting and counts.is_held(q) else 0}


def _order(r: model.QueuedMail) -> tuple[dt.datetime, tuple[int, bytes]]:
    """A row's place in its partition, as Cassandra clusters it (the buckets are merged by it)."""
    return (r.enqueued_at, paging.id_order(r.enqueue_id))


class _Cursor:
    """One partition (slice, bucket) read a page at a time."""

    def __init__(
        self, dao: EnqueuedMailsDAO, queue: str, slice_start: dt.datetime, bucket: int,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> None:
        self._dao, self._key, self._after = dao, (queue, slice_start, bucket), after
        self.rows: list[model.QueuedMail] = []
        self._state: bytes | None = None
        self._done = False

    @property
    def exhausted(self) -> bool:
        return self._done

    async def fill(self, fetch: int, op: str) -> bool:
        """The next page into ``rows``; False when the partition has no more."""
        while not self._done:
            self.rows, self._state = await self._dao.read_page(*self._key, fetch, self._state, self._after)
            self._done = self._state is None
            ROWS_READ.labels(op).inc(len(self.rows))
            if self.rows:
                return True
        self.rows = []
        return False


class CassandraMailQueueView(MailQueueView):
    def __init__(
        self, enqueued: EnqueuedMailsDAO, deleted: DeletedMailsDAO, starts: StartsDAO, slice_counters: CountersDAO,
        counter_buffer: CounterBuffer,
    ) -> None:
        self._enqueued = enqueued
        self._deleted = deleted
        self._starts = starts
        self._counters = slice_counters
        self._buffer = counter_buffer

    async def store(self, mail: model.QueuedMail) -> None:
        await self._enqueued.insert(mail)

    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        await self._deleted.mark(queue, enqueue_id, reason, written_at)

    async def mark_if_live(self, queue: str, enqueue_id: uuid.UUID, reason: str) -> str | None:
        return await self._deleted.mark_if_live(queue, enqueue_id, reason)

    async def mark_gone(
        self, q: model.QueuedMail, reason: str, now: dt.datetime | None = None, written_at: dt.datetime | None = None,
    ) -> None:
        await self._deleted.mark(q.queue, q.enqueue_id, reason, written_at)
        await self.count(q, **_gone(q, now or model.utcnow()))

    async def mark_gone_if_live(self, q: model.QueuedMail, reason: str) -> str | None:
        earlier = await self._deleted.mark_if_live(q.queue, q.enqueue_id, reason)
        if earlier is None:
            await self.count(q, **_gone(q, model.utcnow()))
        return earlier

    async def count(self, q: model.QueuedMail, **deltas: int) -> None:
        # A mail counted ``enqueued`` adds its size to ``bytes``, one counted ``gone`` takes it off.
        deltas["bytes"] = (deltas.get("enqueued", 0) - deltas.get("gone", 0)) * q.size
        for kind, delta in deltas.items():
            if delta:
                await self._buffer.add(q.queue, kind, q.slice_start, delta)

    async def unmark(self, queue: str, enqueue_id: uuid.UUID, at: dt.datetime) -> None:
        await self._deleted.unmark(queue, enqueue_id, at)

    async def state(self, queue: str, enqueue_id: uuid.UUID) -> model.MailState | None:
        return await self._deleted.state(queue, enqueue_id)

    async def reschedule(self, mail: model.QueuedMail, unpublished: bool = False) -> None:
        await self._deleted.schedule(mail, unpublished)

    async def land(self, mail: model.QueuedMail) -> model.MailState | None:
        return await self._deleted.land(mail)

    async def published(self, mail: model.QueuedMail) -> None:
        await self._deleted.published(mail)

    async def live_pages(
        self, queue: str, slice_start: dt.datetime, buckets: int, op: str, first_page: int = 100, max_page: int = MAX_PAGE,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> AsyncIterator[list[model.QueuedMail]]:
        """The slice's live mails, lazily: each bucket is read a page at a time (``first_page``
        rows, doubling up to ``max_page`` as the caller reads on), the buckets merged in enqueue order
        and the marks read only for the rows handed out. The first page costs about
        ``buckets x first_page`` rows whatever the slice holds, and so does a first page ``after``
        an (enqueued_at, enqueue_id): each bucket is read from there (a clustering range)."""
        max_page = max(1, min(max_page, MAX_PAGE))
        fetch = max(1, min(first_page, max_page))
        cursors = [_Cursor(self._enqueued, queue, slice_start, b, after) for b in range(buckets)]
        heap: list[tuple[tuple[dt.datetime, bytes], int, int]] = []
        for i, c in enumerate(cursors):
            if await c.fill(fetch, op):
                heapq.heappush(heap, (_order(c.rows[0]), i, 0))
        while heap:
            out: list[model.QueuedMail] = []
            while heap and len(out) < fetch:
                key, i, at = heapq.heappop(heap)
                c = cursors[i]
                if at == REFILL:
                    # Every row left in the heap sorts after this bucket's last one: its next page
                    # is read only now, when the merge reaches it.
                    if await c.fill(fetch, op):
                        heapq.heappush(heap, (_order(c.rows[0]), i, 0))
                    continue
                out.append(c.rows[at])
                if at + 1 < len(c.rows):
                    heapq.heappush(heap, (_order(c.rows[at + 1]), i, at + 1))
                elif not c.exhausted:
                    heapq.heappush(heap, (key, i, REFILL))
            live = await self.live(queue, out, op)
            if live:
                yield live
            fetch = min(fetch * 2, max_page)

    async def indexed(self, queue: str, column: str, value: Any, op: str) -> list[model.QueuedMail] | None:
        rows = await self.index_rows(queue, column, value, op)
        return None if rows is None else await self.live(queue, rows, op)

    async def index_rows(self, queue: str, column: str, value: Any, op: str) -> list[model.QueuedMail] | None:
        found = await self._enqueued.indexed(queue, column, value)
        if found is None:
            return None
        rows = sorted(found, key=_order)
        ROWS_READ.labels(op).inc(len(rows))
        return rows

    async def live(self, queue: str, rows: list[model.QueuedMail], op: str) -> list[model.QueuedMail]:
        if not rows:
            return []
        sem = asyncio.Semaphore(MARK_CONCURRENCY)

        async def state(row: model.QueuedMail) -> model.MailState | None:
            async with sem:
                return await self._deleted.state(queue, row.enqueue_id)

        states = await asyncio.gather(*(state(r) for r in rows))
        MARKS_READ.labels(op).inc(len(rows))
        # The live rows, each with its current schedule (a RETRY or a Flush may have moved it).
        return [s.applied_to(r) if s is not None else r for r, s in zip(rows, states) if s is None or not s.deleted]

    async def size(self, queue: str) -> counts.Counts:
        start = await self._starts.browse_start(queue)
        if start is None:
            return counts.Counts()
        return counts.summarize(await self._counters.read(queue, counts.KINDS, start), start)

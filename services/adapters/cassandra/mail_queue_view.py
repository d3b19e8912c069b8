"""The mail queue view (services/ports/view.py: MailQueueView) on Cassandra's tables: the mail
rows, their deleted marks and schedules, browse start and the slice counters, through their DAOs
(services/adapters/cassandra/daos.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import uuid

from prometheus_client import Counter

from services.adapters.cassandra.daos import CountersDAO, DeletedMailsDAO, EnqueuedMailsDAO, StartsDAO
from services.domain import counts, model
from services.ports.view import MailQueueView

ROWS_READ = Counter("mailqueue_view_rows_read_total", "Rows read from enqueued_mails by browse-like operations", ["op"])
MARKS_READ = Counter("mailqueue_view_marks_read_total", "Deleted marks read by browse-like operations", ["op"])

#: Deleted marks checked at once per slice partition.
MARK_CONCURRENCY = 64


class CassandraMailQueueView(MailQueueView):
    def __init__(self, enqueued: EnqueuedMailsDAO, deleted: DeletedMailsDAO, starts: StartsDAO, slice_counters: CountersDAO) -> None:
        self._enqueued = enqueued
        self._deleted = deleted
        self._starts = starts
        self._counters = slice_counters

    async def store(self, mail: model.QueuedMail) -> None:
        await self._enqueued.insert(mail)

    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        await self._deleted.mark(queue, enqueue_id, reason, written_at)

    async def unmark(self, queue: str, enqueue_id: uuid.UUID, at: dt.datetime) -> None:
        await self._deleted.unmark(queue, enqueue_id, at)

    async def state(self, queue: str, enqueue_id: uuid.UUID) -> model.MailState | None:
        return await self._deleted.state(queue, enqueue_id)

    async def reschedule(self, mail: model.QueuedMail) -> None:
        await self._deleted.schedule(mail)

    async def live_mails(self, queue: str, slice_start: dt.datetime, buckets: int, op: str) -> list[model.QueuedMail]:
        parts = await asyncio.gather(*(self._enqueued.read_slice(queue, slice_start, b) for b in range(buckets)))
        rows = list(heapq.merge(*parts, key=lambda r: (r.enqueued_at, r.enqueue_id.bytes)))
        ROWS_READ.labels(op).inc(len(rows))
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

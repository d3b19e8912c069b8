"""The queue's view behind one interface, shaped like James's MailQueueView: store a mail, mark
it gone, ask why it is gone (or its current schedule), read the live mails, tell the size.

The domain (enqueuer, subscription, browser, counters, dead-letter marking) goes through this
interface and gets domain objects back (model.QueuedMail, model.MailState, counts.Counts); the
Cassandra tables and their DAOs (services/adapters/cassandra/daos.py) stay behind it.
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import heapq
import uuid

from prometheus_client import Counter

from services.domain import counts
from services.domain import model
from services.adapters.cassandra.daos import CountersDAO, DeletedMailsDAO, EnqueuedMailsDAO, StartsDAO

ROWS_READ = Counter("mailqueue_view_rows_read_total", "Rows read from enqueued_mails by browse-like operations", ["op"])
MARKS_READ = Counter("mailqueue_view_marks_read_total", "Deleted marks read by browse-like operations", ["op"])

#: Deleted marks checked at once per slice partition.
MARK_CONCURRENCY = 64


class MailQueueView(abc.ABC):
    @abc.abstractmethod
    async def store(self, mail: model.QueuedMail) -> None:
        """Write the mail's row (it becomes browsable; its message is published after)."""

    @abc.abstractmethod
    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        """The mail is gone (dequeued, deleted, dead-lettered, expired): browse and dequeue skip it.
        ``written_at``: the mark's write time (last write wins), for an enqueue's undo."""

    @abc.abstractmethod
    async def unmark(self, queue: str, enqueue_id: uuid.UUID, at: dt.datetime) -> None:
        """Remove a mark written before ``at``; one written after it stays."""

    @abc.abstractmethod
    async def state(self, queue: str, enqueue_id: uuid.UUID) -> model.MailState | None:
        """Its mark or its current schedule; None for a live mail as enqueued."""

    async def reason(self, queue: str, enqueue_id: uuid.UUID) -> str | None:
        """Why the mail is gone, or None while it is live."""
        s = await self.state(queue, enqueue_id)
        return s.reason if s is not None else None

    @abc.abstractmethod
    async def reschedule(self, mail: model.QueuedMail) -> None:
        """Record the mail's new schedule (generation, deliver_at, attempts, last error, hold)."""

    @abc.abstractmethod
    async def live_mails(self, queue: str, slice_start: dt.datetime, buckets: int, op: str) -> list[model.QueuedMail]:
        """The live mails of one slice, every bucket merged in enqueue order, each with its current
        schedule. ``op`` labels the read in the metrics (browse, size, delete, ...)."""

    @abc.abstractmethod
    async def size(self, queue: str) -> counts.Counts:
        """Live, delayed and held mails from browse start, from the slice counters."""


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

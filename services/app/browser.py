"""Browse, size and queue information over a queue's view (DESIGN §4): the read side of
browse_svc (the mutating operations: services/app/admin.py).

Every operation iterates the slices from browse start to now over all buckets, in enqueue order,
and skips deleted marks: its cost grows with the live slices, not with the queue's history. The
reads are lazy (a page per bucket at a time, the marks of the rows handed out only), so a Browse
that stops after its first page reads about a page per bucket, however deep the queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import AsyncIterator

from services.app import ages
from services.app.ages import HeadAges
from services.app.queue_state import QueueState
from services.domain import counts, model, paging, shaping, validation
from services.domain.errors import NotFound
from services.domain.filters import BrowseFilter
from services.domain.model import QueueInfo, Summary
from services.domain.slices import from_ms, slice_ms, slice_start, slices_between
from services.ports.blobstore import BlobStore
from services.ports.broker import Broker
from services.ports.view import View

#: Rows a lazy read asks each partition for at first, and at most (doubling in between).
FIRST_PAGE = 100
MAX_PAGE = 5000
#: Index reads in flight at once for one operation on enqueue ids (DeleteMails, MoveMails).
ID_LOOKUPS = 32


def position(q: model.QueuedMail) -> paging.Position:
    """Where a mail sorts in a Browse: its slice, then its enqueue time and id."""
    return paging.Position.of(slice_ms(q.slice_start), q.enqueued_at, q.enqueue_id)


@dataclasses.dataclass(frozen=True)
class Listed:
    """A mail as Browse hands it out: its content when asked and small enough, and the next
    page's token on the last mail of a page that more mails follow (else empty)."""

    mail: model.QueuedMail
    content: bytes | None = None
    next_page_token: str = ""
    #: Its content was asked for but is not in the blob store (a delivery dead-letters it
    #: CONTENT_MISSING): the mail is listed all the same.
    content_missing: bool = False


class Browser:
    def __init__(self, view: View, broker: Broker, blobs: BlobStore, state: QueueState, inline_limit: int) -> None:
        self._view = view
        self._broker = broker
        self._blobs = blobs
        self._state = state
        #: Browse hands out the content of mails up to this size (larger: read it from blob_svc).
        self._inline_limit = inline_limit
        #: The oldest mails' ages, from a head scan that reads on where the last one stopped.
        self.head = HeadAges(self.live_mails)

    async def existing(self, queue: str) -> str:
        """The queue's name, once valid and created; InvalidArgument or NotFound otherwise."""
        validation.queue_name(queue)
        await self._state.require_queue(queue)
        return queue

    async def queues(self) -> list[str]:
        return await self._view.queues.all()

    async def live_mails(
        self, queue: str, op: str = "browse", until: dt.datetime | None = None, first_page: int = MAX_PAGE,
        max_page: int = MAX_PAGE, after: paging.Position | None = None, since: dt.datetime | None = None,
    ) -> AsyncIterator[model.QueuedMail]:
        """Every live mail of the queue, in enqueue order (``until``: only mails enqueued before it).
        ``first_page``: rows asked of each partition at first (doubling as the caller reads on);
        small for a caller that may stop early (Browse with a limit), the largest for full passes.
        ``after``: only the mails after this position (slice, enqueued_at, enqueue_id: a page
        token's), read from there on: the slices before it are not read. ``since``: from this
        slice on (the slices before it, and before browse start, are not read)."""
        config = await self._view.config.current()
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return
        now = model.utcnow()
        # One slice past now: a node whose clock runs ahead may have written there.
        end = slice_start(now + config.slice_window, config.slice_window)
        if after is not None:
            start = max(start, slice_start(from_ms(after.partition), config.slice_window))
        if since is not None:
            start = max(start, slice_start(since, config.slice_window))
        yielded = 0
        for s in slices_between(start, end, config.slice_window):
            if until is not None and s > until:
                return
            resume = None
            if after is not None:
                if slice_ms(s) < after.partition:
                    continue
                resume = (after.enqueued_at, after.id) if slice_ms(s) == after.partition else None
            # A caller that may stop early asked for ``first_page`` rows in all: a slice after the
            # first is asked only what the slices before did not give (a page that spans two slices
            # reads a page, not two).
            page = first_page - yielded if yielded < first_page < max_page else first_page
            async for rows in self._view.mails.live_pages(queue, s, config.bucket_count, op, page, max_page, resume):
                for row in rows:
                    if until is not None and row.enqueued_at >= until:
                        return
                    yielded += 1
                    yield row

    async def candidates(
        self, queue: str, f: BrowseFilter, op: str, until: dt.datetime | None = None,
    ) -> AsyncIterator[model.QueuedMail]:
        """The live mails an operation taking the mails that match ``f`` must examine (``until``:
        only those enqueued before it), in enqueue order; the caller applies ``f``. When ``f``
        names enqueue ids, only the rows the enqueue-id index finds for them (one index read per
        id, whatever the queue's depth); otherwise, or while the index cannot answer, every live
        mail."""
        if f.enqueue_ids is not None:
            found = await self._by_ids(queue, f.enqueue_ids, op)
            if found is not None:
                for q in found:
                    if until is None or q.enqueued_at < until:
                        yield q
                return
        async for q in self.live_mails(queue, op, until=until):
            yield q

    async def _by_ids(self, queue: str, ids: frozenset[uuid.UUID], op: str) -> list[model.QueuedMail] | None:
        """The live mails of the queue with these enqueue ids, from browse start on, in enqueue
        order; None when the index cannot answer (the caller scans)."""
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return []
        slots = asyncio.Semaphore(ID_LOOKUPS)

        async def lookup(enqueue_id: uuid.UUID) -> list[model.QueuedMail] | None:
            async with slots:
                return await self._view.mails.indexed(queue, "enqueue_id", enqueue_id, op)

        found = await asyncio.gather(*(lookup(i) for i in sorted(ids)))
        if any(rows is None for rows in found):
            return None
        live = [q for rows in found for q in rows or () if q.slice_start >= start]
        return sorted(live, key=lambda q: (q.enqueued_at, paging.id_order(q.enqueue_id)))

    async def browse(
        self, queue: str, f: BrowseFilter, limit: int = 0, after: paging.Position | None = None,
    ) -> AsyncIterator[model.QueuedMail]:
        """The live mails matching ``f`` in enqueue order (by slice, then enqueued_at and enqueue
        id), at most ``limit`` (0: all), after ``after`` (a page token's position)."""
        # An enqueue id or a name: the few rows its index finds (None: no index yet, scan).
        key = ("enqueue_id", f.enqueue_id) if f.enqueue_id is not None else ("name", f.name) if f.name is not None else None
        if key is not None:
            found = await self._view.mails.index_rows(queue, *key, "browse")
            if found is not None:
                async for q in self._from_browse_start(queue, sorted(found, key=position), f, limit, after):
                    yield q
                return
        count = 0
        # A limit: the first pages as small as it (a filter that skips rows makes them grow).
        first_page = min(max(limit, FIRST_PAGE), MAX_PAGE) if limit else FIRST_PAGE
        # Enqueue times do not narrow the slices read: a moved or redriven mail keeps its enqueue
        # time in the slice it landed in, and a slice window made smaller leaves wider partitions.
        async for q in self.live_mails(queue, "browse", first_page=first_page, after=after):
            if f.matches(q):
                yield q
                count += 1
                if limit and count >= limit:
                    return

    async def _from_browse_start(
        self, queue: str, rows: list[model.QueuedMail], f: BrowseFilter, limit: int, after: paging.Position | None,
    ) -> AsyncIterator[model.QueuedMail]:
        """Browse by name or id: the live rows the view's index found (``rows``, in Browse order),
        from browse start and after ``after`` on. Their deleted marks are read a chunk at a time,
        as the caller reads on: a page of a name that a million delivered mails had reads about a
        page of marks, not a million."""
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return
        rows = [q for q in rows if q.slice_start >= start and (after is None or position(q) > after)]
        count, chunk, i = 0, max(min(limit, MAX_PAGE), 1) if limit else FIRST_PAGE, 0
        while i < len(rows):
            for q in await self._view.mails.live(queue, rows[i:i + chunk], "browse"):
                if f.matches(q):
                    yield q
                    count += 1
                    if limit and count >= limit:
                        return
            i += chunk
            chunk = min(chunk * 2, MAX_PAGE)

    async def browse_with_content(
        self, queue: str, f: BrowseFilter, limit: int = 0, include_content: bool = False, page_size: int = 0,
        page_token: str = "",
    ) -> AsyncIterator[Listed]:
        """Browse, each mail with its content when asked and the mail is small enough, a page at a
        time when ``page_size`` or ``page_token`` is given (services/domain/paging.py): the last
        mail of a page that more mails follow carries the token of the next page.
        INVALID_ARGUMENT: a bad page size or token, or a limit with either."""
        key = paging.request_key(queue, f)
        page = paging.request(page_size, page_token, limit, paging.MAILS, key)
        queue = await self.existing(queue)
        # A page reads one mail past its end (is there a next page?): the first reads ask for it.
        mails = self.browse(queue, f, limit or (page.size + 1 if page.size else 0), page.after)
        async for q, token in paging.paged(mails, page.size, lambda q: paging.encode(paging.MAILS, key, position(q))):
            content, missing = None, False
            if include_content and q.size <= self._inline_limit:
                try:
                    content = await self._blobs.read_content(q.blob_ids, q.size)
                except NotFound:  # one mail's lost content must not end the listing of the others
                    missing = True
            yield Listed(q, content, token, missing)

    async def size(self, queue: str) -> int:
        return sum([1 async for _ in self.live_mails(queue, "size")])

    async def summary(self, queue: str) -> Summary:
        now = model.utcnow()
        size = ready = held = 0
        oldest = None
        oldest_due: dt.datetime | None = None
        async for q in self.live_mails(queue, "size"):
            size += 1
            oldest = oldest or q
            due = q.due()
            if due > now and counts.is_held(q):
                held += 1
            elif due <= now:
                ready += 1
                oldest_due = due if oldest_due is None else min(oldest_due, due)
        zero = dt.timedelta(0)  # a row from a node whose clock runs ahead is no younger than now
        return Summary(size=size, ready=ready, delayed=size - ready - held, held=held,
                       oldest_age=max(now - oldest.enqueued_at, zero) if oldest is not None else None,
                       oldest_ready_age=max(now - oldest_due, zero) if oldest_due is not None else None)

    async def info(self, queue: str, exact: bool) -> QueueInfo:
        """The queue's counts (a view scan when ``exact``, else its counters), configuration,
        retry policy, dead-letter count (the repository's) and starts."""
        summary = await self.summary(queue) if exact else await self.approximate_summary(queue)
        return QueueInfo(
            queue, summary, not exact, await self._view.config.current(), await self._view.retry_policies.get(queue),
            sum((await (self._view.dead_letters.exact_counts(queue) if exact else self._view.dead_letters.counts(queue))).values()),
            await self._view.starts.browse_start(queue),
            await self._view.starts.content_start(queue),
            tuple(shaping.applying_to((await self._view.shaping.snapshot()).throttles, queue)),
        )

    async def approximate_size(self, queue: str) -> int:
        """The live mails from the queue's counters: one partition read, no mail row."""
        return (await self._view.mails.size(queue)).size

    async def approximate_summary(self, queue: str) -> Summary:
        """The sizes from the queue's counters (one partition read, services/domain/counts.py),
        the ages from a head scan (services/app/ages.py: about a first Browse page)."""
        c = await self._view.mails.size(queue)
        config = await self._view.config.current()
        return ages.summary(c, await self.head.scan(queue, c, config.slice_window))

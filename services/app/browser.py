"""Browse, size and the admin operations over a queue's view (DESIGN §4).

Every operation iterates the slices from browse start to now over all buckets, in enqueue order,
and skips deleted marks: its cost grows with the live slices, not with the queue's history.
Delete and clear mark mails deleted (RabbitMQ is not purged: dequeue skips them) and only touch
mails that existed when the call started.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import AsyncIterator

from services.app import counters
from services.domain import counts, model
from services.domain.errors import InvalidArgument
from services.domain.model import QueueInfo, Summary
from services.domain.slices import slice_start, slices_between
from services.ports.broker import Broker
from services.ports.view import View


@dataclasses.dataclass(frozen=True)
class BrowseFilter:
    """Filters combine with AND; None matches everything. The null sender is ``"<>"``."""

    sender: str | None = None
    recipient: str | None = None
    name: str | None = None
    enqueued_after: dt.datetime | None = None
    enqueued_before: dt.datetime | None = None
    #: Recipient domain, lower case (a mail matches when any recipient is in it).
    recipient_domain: str | None = None
    #: "ready" (deliverable at ``now``) or "delayed" (deliver_at after ``now``).
    schedule: str | None = None
    now: dt.datetime | None = None
    #: Only mails this hold rule re-scheduled.
    held_by: uuid.UUID | None = None

    def matches(self, q: model.QueuedMail) -> bool:
        m = q.mail
        if self.held_by is not None and q.held_by != self.held_by:
            return False
        if self.schedule is not None:
            delayed = q.due() > (self.now or model.utcnow())
            if delayed != (self.schedule == "delayed"):
                return False
        if self.recipient_domain is not None and not any(
            r.rsplit("@", 1)[-1].lower() == self.recipient_domain for r in m.recipients
        ):
            return False
        if self.sender is not None and m.sender != ("" if self.sender == "<>" else self.sender):
            return False
        if self.recipient is not None and self.recipient not in m.recipients:
            return False
        if self.name is not None and m.name != self.name:
            return False
        if self.enqueued_after is not None and q.enqueued_at < self.enqueued_after:
            return False
        if self.enqueued_before is not None and q.enqueued_at >= self.enqueued_before:
            return False
        return True


def delete_condition(name: str | None, sender: str | None, recipient: str | None) -> BrowseFilter:
    """Exactly one of name / sender / recipient, as a filter."""
    given = [v for v in (name, sender, recipient) if v is not None]
    if len(given) != 1:
        raise InvalidArgument("a delete needs exactly one condition: name, sender or recipient")
    return BrowseFilter(sender=sender, recipient=recipient, name=name)


def flush_condition(sender: str | None = None, recipient: str | None = None, recipient_domain: str | None = None,
                    name: str | None = None) -> BrowseFilter:
    """At most one condition (none: every delayed mail), as a filter of delayed mails."""
    given = [v for v in (sender, recipient, recipient_domain, name) if v is not None]
    if len(given) > 1:
        raise InvalidArgument("a flush takes at most one condition: sender, recipient, recipient_domain or name")
    if recipient_domain is not None and (not recipient_domain or "@" in recipient_domain or len(recipient_domain) > 255):
        raise InvalidArgument("recipient_domain must be a domain name (the part after @)")
    return BrowseFilter(sender=sender, recipient=recipient, name=name, schedule="delayed",
                        recipient_domain=recipient_domain.lower() if recipient_domain else None)


@dataclasses.dataclass
class Progress:
    scanned: int = 0
    deleted: int = 0
    done: bool = False


class Browser:
    def __init__(self, view: View, broker: Broker) -> None:
        self._view = view
        self._broker = broker

    async def live_mails(self, queue: str, op: str = "browse", until: dt.datetime | None = None) -> AsyncIterator[model.QueuedMail]:
        """Every live mail of the queue, in enqueue order (``until``: only mails enqueued before it)."""
        config = await self._view.config.current()
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return
        now = model.utcnow()
        # One slice past now: a node whose clock runs ahead may have written there.
        end = slice_start(now + config.slice_window, config.slice_window)
        for s in slices_between(start, end, config.slice_window):
            if until is not None and s > until:
                return
            rows = await self._read_slice(queue, s, config.bucket_count, op)
            for row in rows:
                if until is not None and row.enqueued_at >= until:
                    return
                yield row

    async def _read_slice(self, queue: str, s: dt.datetime, buckets: int, op: str) -> list[model.QueuedMail]:
        return await self._view.mails.live_mails(queue, s, buckets, op)

    async def browse(self, queue: str, f: BrowseFilter, limit: int = 0) -> AsyncIterator[model.QueuedMail]:
        count = 0
        async for q in self.live_mails(queue, "browse"):
            if f.matches(q):
                yield q
                count += 1
                if limit and count >= limit:
                    return

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
        return Summary(size=size, ready=ready, delayed=size - ready - held, held=held,
                       oldest_age=now - oldest.enqueued_at if oldest is not None else None,
                       oldest_ready_age=now - oldest_due if oldest_due is not None else None)

    async def info(self, queue: str, exact: bool) -> QueueInfo:
        """The queue's counts (a view scan when ``exact``, else its counters), configuration,
        retry policy, dead-letter count and starts."""
        summary = await self.summary(queue) if exact else await self.approximate_summary(queue)
        return QueueInfo(
            queue, summary, not exact, await self._view.config.current(), await self._view.retry_policies.get(queue),
            await self._broker.dead_lettered(queue), await self._view.starts.browse_start(queue),
            await self._view.starts.content_start(queue),
        )

    async def approximate_summary(self, queue: str) -> Summary:
        """The summary from the queue's counters: one partition read (services/app/counters.py)."""
        c = await self._view.mails.size(queue)
        now = model.utcnow()
        age = lambda s: now - s if s is not None else None  # noqa: E731
        return Summary(size=c.size, ready=c.ready, delayed=c.delayed - c.held, held=c.held,
                       oldest_age=age(c.oldest_slice), oldest_ready_age=age(c.oldest_ready_slice))

    async def flush(self, queue: str, f: BrowseFilter) -> int:
        """Make every delayed mail matching ``f`` deliverable now, in enqueue order.

        Each gets a new generation: published to the work queue, then recorded, so the copy still
        waiting in the delay ladder is skipped when it arrives (the mail is delivered once).
        """
        f = dataclasses.replace(f, schedule="delayed", now=model.utcnow() + dt.timedelta(milliseconds=1))
        count = 0
        async for q in self.live_mails(queue, "flush"):
            if not f.matches(q):
                continue
            now = model.utcnow()
            flushed = dataclasses.replace(q, deliver_at=now, generation=q.generation + 1,
                                          held_by=counts.NOT_HELD if q.held_by is not None else None)
            await self._broker.publish(flushed)
            await self._view.mails.reschedule(flushed)
            await counters.bump(self._view, q, delayed=-1, held=-1 if counts.is_held(q) else 0)
            count += 1
        return count

    async def delete(self, queue: str, f: BrowseFilter, every: int = 100) -> AsyncIterator[Progress]:
        """Mark deleted every live mail matching ``f`` that existed when the call started."""
        started = model.utcnow()
        p = Progress()
        async for q in self.live_mails(queue, "delete", until=started + dt.timedelta(milliseconds=1)):
            p.scanned += 1
            if f.matches(q):
                await counters.mark(self._view, q, "deleted by admin")
                p.deleted += 1
            if p.scanned % every == 0:
                yield dataclasses.replace(p)
        p.done = True
        yield p

    async def reconcile(self, queue: str) -> tuple[counts.Counts, counts.Counts]:
        """Rewrite the queue's counters from an exact pass; (before, after)."""
        before = await self._view.mails.size(queue)
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return before, before
        now = model.utcnow()
        live = [q async for q in self.live_mails(queue, "reconcile")]
        raw = await self._view.counters.read(queue, counts.KINDS, start)
        for s, kind, delta in counts.exact_deltas(raw, live, start, now):
            await self._view.counters.add(queue, kind, s, delta)
        return before, await self._view.mails.size(queue)

    async def republish(self, queue: str, older_than: dt.timedelta) -> int:
        """Publish again every live mail enqueued before ``now - older_than`` (heals a lossy broker)."""
        if older_than < dt.timedelta(0):
            raise InvalidArgument("older_than must not be negative")
        cutoff = model.utcnow() - older_than
        count = 0
        async for q in self.live_mails(queue, "republish", until=cutoff):
            await self._broker.publish(q, max(q.due() - model.utcnow(), dt.timedelta(0)))
            count += 1
        return count

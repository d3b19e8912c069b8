"""Enqueue (DESIGN §4): validate -> content -> view row -> confirmed publish -> reply.

Small inline content (up to ``MAILQUEUE_SMALL_BLOB_BYTES``) also travels in the message, so
that its delivery reads no blob; the blob stays the content of record (browse, requeue, repair).

A mail is acknowledged only after its blob, its view row and its confirmed RabbitMQ message all
exist. On any failure after the row was written, the mail is marked deleted (compensation, right
next to the write it undoes) and the caller gets BackendUnavailable: nothing half-enqueued is
ever delivered or browsed. A compensation that fails too (the outage that failed the enqueue, a
quorum lost with a write already on one replica) is retried in the background until it lands,
so the half-written row never surfaces once the backend is back. Blobs are content-addressed and
shared, so a failed enqueue leaves its blob for the retention sweep instead of deleting what
another mail may reference.

While the broker blocks publishers (a RabbitMQ memory or disk alarm), an enqueue is refused after
validation and before anything is written. Idempotency keys are claimed, and taken over from an
attempt that is gone, by services/app/key_claims.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from prometheus_client import Counter, Gauge

from services.app import counters, mail_events
from services.app.grouping import Grouper
from services.app.key_claims import KeyClaims, undo_time
from services.app.queue_state import QueueState
from services.app.quota_keeper import QuotaKeeper
from services.app.retry import retrying
from services.domain import model, quotas, schedule, trace, validation
from services.domain.backoff import Backoff
from services.domain.errors import BackendUnavailable, InvalidArgument, NotFound, PublishersBlocked, ResourceExhausted
from services.domain.model import BlobInfo
from services.domain.settings import LimitSettings
from services.domain.slices import bucket_of, slice_start
from services.ports.blobstore import BlobStore
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

log = logging.getLogger(__name__)

ENQUEUED = Counter("mailqueue_enqueued_total", "Mails acknowledged to producers", ["queue"])
ENQUEUE_FAILED = Counter("mailqueue_enqueue_failed_total", "Enqueues answered with a retryable error", ["queue"])
REFUSED_BLOCKED = Counter(
    "mailqueue_enqueue_refused_blocked_total",
    "Enqueues refused at once, nothing written, while RabbitMQ blocks publishers (a memory or disk alarm)", ["queue"],
)
COMPENSATIONS_PENDING = Gauge(
    "mailqueue_enqueue_compensations_pending", "Undo writes of failed enqueues waiting for Cassandra to answer",
)
#: Undo writes that failed are retried in the background with this policy, until they land.
COMPENSATION_BACKOFF = Backoff("enqueue compensation", initial_s=0.5, multiplier=2.0, max_s=10.0)
#: Past this many pending undo writes, new ones are only logged (an outage of hours under load).
MAX_PENDING_COMPENSATIONS = 100_000


ContentWriter = Callable[[], Awaitable[tuple[tuple[str, ...], int]]]
#: A producer's (deliver_at, delay), at most one set (services/domain/schedule.py).
Schedule = tuple[dt.datetime | None, dt.timedelta | None]


def _to_millis(t: dt.datetime) -> dt.datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


@dataclasses.dataclass(frozen=True)
class _Grouped:
    """A checked mail without an idempotency key, waiting for its group (services/app/grouping.py):
    its content inline (to be stored by the group) or streamed to the blob store already."""

    queue: str
    mail: model.Mail
    when: Schedule
    priority: str
    content: bytes | None = None
    stored: BlobInfo | None = None
    #: The call's trace context, taken when it is submitted (the group runs in another call's task).
    traceparent: str = dataclasses.field(default_factory=trace.current_traceparent.get)


@dataclasses.dataclass
class _Attempt:
    """How far a failed attempt got: what its undo has to cover."""

    written: model.QueuedMail | None = None  # its view row may exist
    counted: bool = False  # and its counters were bumped


class Enqueuer:
    def __init__(
        self, view: View, broker: Broker, blobs: BlobStore, limits: LimitSettings, state: QueueState,
        events: EventLog | None = None, quota_keeper: QuotaKeeper | None = None,
    ) -> None:
        self._view = view
        #: Enqueue quotas and depth limits, checked last before anything is written (None: none).
        self.quotas = quota_keeper
        #: Each acknowledged enqueue's ENQUEUED event is recorded before the reply (services/app/mail_events.py).
        self._events: EventLog = events if events is not None else mail_events.Unrecorded()
        self._broker = broker
        self._blobs = blobs
        self._limits = limits
        self._state = state
        self._compensations: set[asyncio.Task[None]] = set()
        #: Idempotency keys: claims, take-overs, and this process's lease (services/app/key_claims.py).
        self.claims = KeyClaims(view, limits)
        #: Mails without an idempotency key run in groups (services/app/grouping.py).
        self._grouper: Grouper[_Grouped, model.EnqueueResult] = Grouper(self._run_group)

    # ------------------------------------------------------------------ the three content forms
    async def enqueue_inline(
        self, queue: str, mail: model.Mail, content: bytes, key: str = "", when: Schedule = (None, None),
        priority: str = "normal",
    ) -> model.EnqueueResult:
        if len(content) > self._limits.max_inline_bytes:
            raise ResourceExhausted(
                f"inline content is {len(content)} bytes, over the limit of {self._limits.max_inline_bytes}: "
                "use EnqueueStream or put the content with BlobService.Put first"
            )
        if not key:
            await self._check(queue, mail, key, when, len(content))
            return await self._grouper.submit(_Grouped(queue, mail, when, priority, content=content))

        async def write() -> tuple[tuple[str, ...], int]:
            info = await self._blobs.store(content)
            return (info.blob_id,), info.size

        carried = self._limits.carried(content, len(content))
        return await self._enqueue(queue, mail, write, key, when, priority, carried, len(content))

    async def enqueue_refs(
        self, queue: str, mail: model.Mail, blob_ids: list[str], key: str = "", when: Schedule = (None, None),
        priority: str = "normal",
    ) -> model.EnqueueResult:
        if not blob_ids:
            raise InvalidArgument("blob_refs must name at least one blob")
        for b in blob_ids:
            validation.blob_id(b)

        async def write() -> tuple[tuple[str, ...], int]:
            size = 0
            for b in blob_ids:
                try:
                    size += (await self._blobs.stat(b)).size
                except NotFound:
                    raise NotFound(f"blob {b} not found: put the content with BlobService.Put first") from None
            self._check_mail_size(size)
            return tuple(blob_ids), size

        return self._charged(queue, mail, await self._enqueue(queue, mail, write, key, when, priority))

    async def enqueue_stream(
        self, queue: str, mail: model.Mail, chunks: AsyncIterator[bytes], key: str = "", when: Schedule = (None, None),
        priority: str = "normal",
    ) -> model.EnqueueResult:
        async def limited() -> AsyncIterator[bytes]:
            total = 0
            async for chunk in chunks:
                total += len(chunk)
                self._check_mail_size(total)
                yield chunk

        if not key:
            # The content streams to the blob store on its own; the row and the publish go with a group.
            await self._check(queue, mail, key, when)
            stored = await self._blobs.put(limited())
            return self._charged(queue, mail, await self._grouper.submit(_Grouped(queue, mail, when, priority, stored=stored)))

        async def write() -> tuple[tuple[str, ...], int]:
            info = await self._blobs.put(limited())
            return (info.blob_id,), info.size

        return self._charged(queue, mail, await self._enqueue(queue, mail, write, key, when, priority))

    def _facts(self, queue: str, mail: model.Mail, size: int) -> quotas.Facts:
        return quotas.Facts(quotas.current_tenant.get(), mail.sender, queue, size)

    def _charged(self, queue: str, mail: model.Mail, result: model.EnqueueResult) -> model.EnqueueResult:
        """A mail whose size was not known at its check (a stream, blob refs): its bytes charged now."""
        if self.quotas is not None and not result.duplicate:
            self.quotas.charge(self._facts(queue, mail, result.size))
        return result

    def _check_mail_size(self, size: int) -> None:
        if size > self._limits.max_mail_bytes:
            raise ResourceExhausted(f"mail content exceeds the limit of {self._limits.max_mail_bytes} bytes")

    # ------------------------------------------------------------------ the common path
    async def _check(self, queue: str, mail: model.Mail, key: str, when: Schedule, size: int = 0) -> None:
        """Refuse what is invalid, what could not be published now, or what a quota refuses (last:
        a mail refused for anything else takes nothing from a quota), before anything is written.
        ``size``: the content's bytes when known before writing (inline content), else 0."""
        validation.queue_name(queue)
        validation.mail(mail, self._limits)
        schedule.deliver_at(model.utcnow(), *when)
        if len(key) > 256:
            raise InvalidArgument("idempotency_key is longer than 256 characters")
        await self._state.require_queue(queue)
        self._refuse_if_blocked(queue)
        if self.quotas is not None:
            self.quotas.check(self._facts(queue, mail, size))

    def _refuse_if_blocked(self, queue: str) -> None:
        """While the broker blocks publishers (a resource alarm), a publish would wait for the alarm
        to be lifted: refuse at once, retryable, before the claim, the blob or the row is written."""
        reason = self._broker.blocked()
        if reason is not None:
            REFUSED_BLOCKED.labels(queue).inc()
            raise PublishersBlocked(reason)

    async def _enqueue(
        self, queue: str, mail: model.Mail, write_content: ContentWriter, key: str, when: Schedule, priority: str,
        carried: bytes | None = None, size: int = 0,
    ) -> model.EnqueueResult:
        try:
            await self._check(queue, mail, key, when, size)
        except quotas.QuotaExceeded:
            # A resend of a mail already enqueued gets its earlier answer, not a refusal: it adds
            # nothing to the queue. One read, only when a keyed mail is refused.
            done = await self._view.idempotency.committed(queue, key) if key else None
            if done is None:
                raise
            await self._events.record([mail_events.resent(queue, mail, done)])
            return done
        enqueue_id = uuid.uuid4()
        # This attempt's instant (to the millisecond, as Cassandra keeps the claim's): its claim
        # time, and the write time of its undo marks (see services/app/key_claims.py).
        started = _to_millis(model.utcnow())
        if key:
            try:
                earlier = await self.claims.claim(queue, key, enqueue_id, started)
            except BackendUnavailable:
                # The claim may have landed though it timed out: release it (if it is ours), or
                # the client's retry would find it in progress until it is abandoned.
                await self._undo(queue, key, enqueue_id, started, _Attempt())
                raise
            if isinstance(earlier, model.EnqueueResult):
                # A resend is charged once, with its first send: what the check took is given back.
                if self.quotas is not None:
                    self.quotas.refund(self._facts(queue, mail, size))
                # Answered again: its ENQUEUED event again (same id), marked resent.
                await self._events.record([mail_events.resent(queue, mail, earlier)])
                return earlier
            enqueue_id = earlier
        attempt = _Attempt()
        try:
            result = await self._store(queue, mail, enqueue_id, write_content, when, priority, carried, started, attempt)
        except BaseException:
            ENQUEUE_FAILED.labels(queue).inc()
            await self._undo(queue, key, enqueue_id, started, attempt)
            raise
        if key:
            await self._eventually(lambda: self._view.idempotency.commit(queue, key, result), "commit idempotency key")
        ENQUEUED.labels(queue).inc()
        return model.EnqueueResult.of(result)

    async def _store(
        self, queue: str, mail: model.Mail, enqueue_id: uuid.UUID, write_content: ContentWriter, when: Schedule,
        priority: str, carried: bytes | None, started: dt.datetime, attempt: _Attempt,
    ) -> model.QueuedMail:
        """Content, view row, counters, message; ``attempt`` says how far it got."""
        blob_ids, size = await write_content()
        queued = await self._queued(queue, mail, enqueue_id, blob_ids, size, when, priority)
        # The write may land although it fails (a timeout): from here on, a failure is undone.
        attempt.written = queued
        await self._view.mails.store(queued)
        await self._count(queued, attempt)
        await self._publish(queued, carried)
        # Part of the enqueue: if it cannot be recorded, the mail is undone like any other failure.
        await self._events.record([mail_events.enqueued(queued)])
        return queued

    async def _queued(
        self, queue: str, mail: model.Mail, enqueue_id: uuid.UUID, blob_ids: tuple[str, ...], size: int, when: Schedule,
        priority: str, traceparent: str | None = None,
    ) -> model.QueuedMail:
        """The mail's view row, in the slice of now (or browse start, if this clock lags); it
        carries ``traceparent``, by default the call's (services/domain/trace.py)."""
        config = await self._state.config()
        now = model.utcnow()
        start = slice_start(now, config.slice_window)
        browse_start = await self._state.browse_start(queue)
        if browse_start is not None and start < browse_start:
            # A node whose clock lags must not write behind browse start: the sweep may drop it.
            log.warning("clock behind browse start; writing into the browse start slice",
                        extra={"queue": queue, "slice": start.isoformat(), "browse_start": browse_start.isoformat()})
            start = browse_start
        return model.QueuedMail(
            queue=queue, enqueue_id=enqueue_id, enqueued_at=now, mail=mail, blob_ids=blob_ids, size=size,
            slice_start=start, bucket=bucket_of(mail.name, str(enqueue_id), config.bucket_count),
            deliver_at=schedule.deliver_at(now, *when), priority=priority,
            traceparent=trace.current_traceparent.get() if traceparent is None else traceparent,
        )

    async def _count(self, queued: model.QueuedMail, attempt: _Attempt) -> None:
        await counters.bump(self._view, queued, enqueued=1, delayed=1 if queued.deliver_at is not None else 0)
        attempt.counted = True

    async def _publish(self, queued: model.QueuedMail, carried: bytes | None) -> None:
        delay = queued.deliver_at - queued.enqueued_at if queued.deliver_at is not None else dt.timedelta(0)
        await self._broker.publish(queued, delay, content=carried)

    # ------------------------------------------------------------------ many at once
    async def _run_group(self, items: Sequence[_Grouped]) -> list[model.EnqueueResult | BaseException]:
        """Enqueue the checked mails of concurrent calls as one group: each step is taken for every
        mail of the group in the same event-loop turn (the blob writes of inline content, then the
        view rows, then the publishes), so their requests leave together: one network write per
        backend, the rows in shared group commits, the confirms pipelined.

        Each mail keeps its own outcome, exactly as if it had been enqueued alone: a mail that
        fails is undone (see _undo) and answered with its error, and the others go on."""
        out: list[model.EnqueueResult | BaseException | None] = [None] * len(items)
        started = _to_millis(model.utcnow())
        attempts: dict[int, _Attempt] = {}
        queued: dict[int, model.QueuedMail] = {}

        def failed(i: int, e: BaseException) -> None:
            out[i] = e
            ENQUEUE_FAILED.labels(items[i].queue).inc()

        for i, it in enumerate(items):  # the alarm may have begun while they waited for the group
            try:
                self._refuse_if_blocked(it.queue)
            except PublishersBlocked as e:
                out[i] = e
        try:
            inline = [i for i, it in enumerate(items) if it.stored is None and out[i] is None]
            written = await asyncio.gather(*(self._blobs.store(items[i].content or b"") for i in inline),
                                           return_exceptions=True)
            stored: dict[int, BlobInfo | BaseException] = dict(zip(inline, written, strict=True))
            for i, it in enumerate(items):
                if out[i] is not None:
                    continue
                info = it.stored or stored[i]
                if isinstance(info, BaseException):
                    failed(i, info)
                    continue
                try:
                    queued[i] = await self._queued(
                        it.queue, it.mail, uuid.uuid4(), (info.blob_id,), info.size, it.when, it.priority, it.traceparent)
                except Exception as e:  # noqa: BLE001 - nothing of this mail is in the view yet
                    failed(i, e)
            live = list(queued)
            for i in live:  # the writes may land although they fail (a timeout): undone from here on
                attempts[i] = _Attempt(written=queued[i])
            rows = await asyncio.gather(*(self._view.mails.store(queued[i]) for i in live), return_exceptions=True)
            live = _survivors(live, rows, failed)
            for i in live:
                await self._count(queued[i], attempts[i])
            sent = await asyncio.gather(*(self._publish(queued[i], self._carried(items[i])) for i in live),
                                        return_exceptions=True)
            live = _survivors(live, sent, failed)
            if live:  # the group's ENQUEUED events in one record; unrecorded, the mails are undone
                try:
                    await self._events.record([mail_events.enqueued(queued[i]) for i in live])
                except Exception as e:  # noqa: BLE001 - each mail answered with the error, and undone
                    for i in live:
                        failed(i, e)
                    live = []
        except BaseException as e:  # cancelled (the server stopping): every mail not answered is undone
            for i in attempts:
                if out[i] is None:
                    failed(i, e)
            raise
        finally:
            undo = [self._undo(items[i].queue, "", queued[i].enqueue_id, started, attempts[i])
                    for i in attempts if out[i] is not None]
            if undo:
                await asyncio.shield(asyncio.gather(*undo, return_exceptions=True))
        for i in live:
            ENQUEUED.labels(items[i].queue).inc()
            out[i] = model.EnqueueResult.of(queued[i])
        return [r if r is not None else RuntimeError("no outcome") for r in out]

    def _carried(self, item: _Grouped) -> bytes | None:
        return self._limits.carried(item.content, len(item.content)) if item.content is not None else None

    async def _undo(self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime, attempt: _Attempt) -> None:
        """Undo a failed attempt (eventually): its mail marked deleted if its row may exist (a
        message it may have published is then skipped), **then** its idempotency claim released.

        In that order: while the mark has not landed, the claim stays, so a retry with the key
        takes over this enqueue id (one mail, whatever was written) and never makes a second
        mail beside a live one. Until the release lands, this process knows the claim failed
        and a retry here takes it over at once.
        """
        if key:
            self.claims.failed(queue, key, enqueue_id)

        written = attempt.written

        async def undo() -> None:  # retried until it lands; the mark (and its counters) once
            nonlocal written
            if written is not None and attempt.counted:
                await counters.mark(self._view, written, "enqueue failed", written_at=undo_time(started))
            elif written is not None:
                await self._view.mails.mark(queue, enqueue_id, "enqueue failed", undo_time(started))
            written = None
            if key:
                await self.claims.release(queue, key, enqueue_id, started)

        if written is not None or key:
            await self._eventually(undo, "undo a failed enqueue")

    async def _eventually(self, op: Callable[[], Awaitable[None]], what: str) -> None:
        """Run a compensating (or bookkeeping) write; if the backend does not answer, keep retrying
        it in the background (the caller's answer is not delayed by the outage that caused it)."""
        try:
            await op()
            return
        except BackendUnavailable as e:
            log.warning("could not %s, retrying in the background: %s", what, e)
        if len(self._compensations) >= MAX_PENDING_COMPENSATIONS:
            log.error("could not %s and %d undo writes are pending already: given up", what, len(self._compensations))
            return
        task = asyncio.ensure_future(retrying(op, COMPENSATION_BACKOFF, (BackendUnavailable,), log))
        self._compensations.add(task)
        COMPENSATIONS_PENDING.inc()

        def done(t: asyncio.Task[None]) -> None:
            self._compensations.discard(t)
            COMPENSATIONS_PENDING.dec()
            if not t.cancelled() and t.exception() is not None:
                log.error("could not %s: %s", what, t.exception())

        task.add_done_callback(done)


def _survivors(live: list[int], outcomes: Sequence[object], failed: Callable[[int, BaseException], None]) -> list[int]:
    """The mails of ``live`` whose step succeeded; the others are ``failed``."""
    kept = []
    for i, outcome in zip(live, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            failed(i, outcome)
        else:
            kept.append(i)
    return kept

"""The writes of a group of mails (DESIGN §4), step by step for the whole group: inline content's
blob writes, the view rows, the counters, the confirmed publishes, the ENQUEUED events, the
idempotency commits. services/app/grouping.py forms the groups (a lone call is a group of one);
services/app/enqueuer.py checks each mail, claims its key and stores streamed content before.

A mail is acknowledged only after its blob, its view row and its confirmed RabbitMQ message all
exist. Small inline content (up to ``MAILQUEUE_SMALL_BLOB_BYTES``) also travels in the message,
so its delivery reads no blob; the blob stays the content of record. Each mail keeps its own
outcome: one that fails is undone (services/app/compensation.py) and answered with its error,
and the others go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from services.app import counters, mail_events
from services.app.compensation import Attempt, Compensation
from services.app.queue_state import QueueState
from services.domain import history_keys, model, schedule, trace
from services.domain.errors import PublishersBlocked
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

#: A producer's (deliver_at, delay), at most one set (services/domain/schedule.py).
Schedule = tuple[dt.datetime | None, dt.timedelta | None]


def to_millis(t: dt.datetime) -> dt.datetime:
    """``t`` to the millisecond, as Cassandra keeps a claim's time."""
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def refuse_if_blocked(broker: Broker, queue: str) -> None:
    """While the broker blocks publishers (a resource alarm), a publish would wait for the alarm
    to be lifted: refuse at once, retryable, before the claim, the blob or the row is written."""
    reason = broker.blocked()
    if reason is not None:
        REFUSED_BLOCKED.labels(queue).inc()
        raise PublishersBlocked(reason)


@dataclasses.dataclass(frozen=True)
class Pending:
    """A checked mail on its way to its group (its key claimed, its streamed content stored)."""

    queue: str
    mail: model.Mail
    when: Schedule
    priority: str
    #: Inline content, stored by the group; else the content stored or checked before it.
    content: bytes | None = None
    blob_ids: tuple[str, ...] = ()
    size: int = 0
    #: With an idempotency key: the claimed enqueue id and the claim's instant.
    key: str = ""
    enqueue_id: uuid.UUID | None = None
    started: dt.datetime | None = None
    #: The call's trace context, taken when it is made (the group runs in another call's task).
    traceparent: str = dataclasses.field(default_factory=trace.current_traceparent.get)


class GroupWrites:
    def __init__(self, view: View, broker: Broker, blobs: BlobStore, limits: LimitSettings, state: QueueState,
                 events: EventLog, compensation: Compensation) -> None:
        self._view, self._broker, self._blobs, self._limits, self._state = view, broker, blobs, limits, state
        self._events, self._compensation = events, compensation

    async def run_group(self, items: Sequence[Pending]) -> list[model.EnqueueResult | BaseException]:
        """Enqueue the checked mails of concurrent calls as one group: each step is taken for every
        mail of the group in the same event-loop turn (the blob writes of inline content, then the
        view rows, then the publishes), so their requests leave together: one network write per
        backend, the rows in shared group commits, the confirms pipelined.

        Each mail keeps its own outcome, exactly as if it had been enqueued alone: a mail that
        fails is undone (services/app/compensation.py) and answered with its error, and the others go on."""
        out: list[model.EnqueueResult | BaseException | None] = [None] * len(items)
        now = to_millis(model.utcnow())
        started = [it.started or now for it in items]
        fresh = iter(history_keys.new_ids(sum(1 for it in items if it.enqueue_id is None)))
        ids = [it.enqueue_id or next(fresh) for it in items]  # a fresh group shares history partitions
        attempts: dict[int, Attempt] = {}
        queued: dict[int, model.QueuedMail] = {}

        def failed(i: int, e: BaseException) -> None:
            out[i] = e
            ENQUEUE_FAILED.labels(items[i].queue).inc()

        for i, it in enumerate(items):  # the alarm may have begun while they waited for the group
            try:
                refuse_if_blocked(self._broker, it.queue)
            except PublishersBlocked as e:
                out[i] = e
        live: list[int] = []
        try:
            inline = [i for i, it in enumerate(items) if it.content is not None and out[i] is None]
            written = await asyncio.gather(*(self._blobs.store(items[i].content or b"") for i in inline),
                                           return_exceptions=True)
            stored = dict(zip(inline, written, strict=True))
            for i, it in enumerate(items):
                if out[i] is not None:
                    continue
                blob_ids, size = it.blob_ids, it.size
                if i in stored:
                    info = stored[i]
                    if isinstance(info, BaseException):
                        failed(i, info)
                        continue
                    blob_ids, size = (info.blob_id,), info.size
                try:
                    queued[i] = await self._queued(it, ids[i], blob_ids, size)
                except Exception as e:  # noqa: BLE001 - nothing of this mail is in the view yet
                    failed(i, e)
            live = list(queued)
            for i in live:  # the writes may land although they fail (a timeout): undone from here on
                attempts[i] = Attempt(written=queued[i])
            rows = await asyncio.gather(*(self._view.mails.store(queued[i]) for i in live), return_exceptions=True)
            live = _survivors(live, rows, failed)
            for i in live:
                await counters.bump(self._view, queued[i], enqueued=1, delayed=1 if queued[i].deliver_at is not None else 0)
                attempts[i].counted = True
            sent = await asyncio.gather(*(self._broker.publish(
                queued[i],
                queued[i].deliver_at - queued[i].enqueued_at if queued[i].deliver_at is not None else dt.timedelta(0),
                content=self._limits.carried(items[i].content, len(items[i].content or b"")),  # small inline content
            ) for i in live), return_exceptions=True)
            live = _survivors(live, sent, failed)
            if live:  # the group's ENQUEUED events in one record; unrecorded, the mails are undone
                try:
                    await self._events.record([mail_events.enqueued(queued[i]) for i in live])
                except Exception as e:  # noqa: BLE001 - each mail answered with the error, and undone
                    for i in live:
                        failed(i, e)
                    live = []
            await asyncio.gather(*(self._compensation.eventually(
                lambda i=i: self._view.idempotency.commit(items[i].queue, items[i].key, queued[i]), "commit idempotency key",
            ) for i in live if items[i].key))
        except BaseException as e:  # cancelled (the server stopping): every mail not answered is undone
            for i in range(len(items)):
                if out[i] is None:
                    failed(i, e)
            raise
        finally:
            undo = [self._compensation.undo(it.queue, it.key, ids[i], started[i], attempts.get(i, Attempt()))
                    for i, it in enumerate(items) if out[i] is not None and (i in attempts or it.key)]
            if undo:
                await asyncio.shield(asyncio.gather(*undo, return_exceptions=True))
        for i in live:
            ENQUEUED.labels(items[i].queue).inc()
            out[i] = model.EnqueueResult.of(queued[i])
        return [r if r is not None else RuntimeError("no outcome") for r in out]

    async def _queued(self, it: Pending, enqueue_id: uuid.UUID, blob_ids: tuple[str, ...], size: int) -> model.QueuedMail:
        """The mail's view row, in the slice of now (or browse start, if this clock lags); it
        carries the call's trace context (services/domain/trace.py)."""
        config = await self._state.config()
        now = model.utcnow()
        start = slice_start(now, config.slice_window)
        browse_start = await self._state.browse_start(it.queue)
        if browse_start is not None and start < browse_start:
            # A node whose clock lags must not write behind browse start: the sweep may drop it.
            log.warning("clock behind browse start; writing into the browse start slice",
                        extra={"queue": it.queue, "slice": start.isoformat(), "browse_start": browse_start.isoformat()})
            start = browse_start
        return model.QueuedMail(
            queue=it.queue, enqueue_id=enqueue_id, enqueued_at=now, mail=it.mail, blob_ids=blob_ids, size=size,
            slice_start=start, bucket=bucket_of(it.mail.name, str(enqueue_id), config.bucket_count),
            deliver_at=schedule.deliver_at(now, *it.when), priority=it.priority, traceparent=it.traceparent,
        )


def _survivors(live: list[int], outcomes: Sequence[object], failed: Callable[[int, BaseException], None]) -> list[int]:
    """The mails of ``live`` whose step succeeded; the others are ``failed``."""
    kept = []
    for i, outcome in zip(live, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            failed(i, outcome)
        else:
            kept.append(i)
    return kept

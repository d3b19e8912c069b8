"""Enqueue groups (DESIGN §4): concurrent enqueues formed into groups, and each group's writes
taken step by step for all its mails together: inline content's blob writes, the view rows, the
counters, the confirmed publishes, the ENQUEUED events, the idempotency commits.
services/app/enqueuer.py checks each mail, claims its key and stores streamed content before.

Forming (``Grouper``): one Enqueue at a time from many connections (how SMTP servers send)
reaches the server spread over time: each call's blob write, row write and publish would leave
alone, one request and one network write each, and the backends pay per request. A call's item
runs at once when fewer than ``running`` groups are running (a lone caller pays no wait);
otherwise it waits, with every item that arrives meanwhile, until a running group finishes, and
then they run as the next group, at most ``size`` to a group. So groups grow with the load by
themselves, as the calls that arrive while the backends answer the groups before them. A caller
that leaves (cancelled, its deadline passed) while its item waits takes it out of the group:
nothing of it is written, and its idempotency claim, if any, is released
(services/app/compensation.py). Once its group runs, the group finishes it, answered or not.

Not one primitive with the view's group commit and group read
(services/adapters/cassandra/group_commit.py, group_read.py), which gather one Cassandra request
per partition or queue at the next loop turn and never withdraw an item: a Grouper gathers whole
enqueues (blob, row and publish steps) across queues, runs a lone call at once, gives each item
its own outcome and withdraws an item whose caller left, and it runs use-case steps in app/,
which the adapters may not import.

Writing (``GroupWrites.run_group``): each step for every mail of the group in the same
event-loop turn. A mail is acknowledged only after its blob, its view row and its confirmed
RabbitMQ message all exist. Small inline content (up to ``MAILQUEUE_SMALL_BLOB_BYTES``) also
travels in the message, so its delivery reads no blob; the blob stays the content of record.
Each mail keeps its own outcome: one that fails is undone (services/app/compensation.py) and
answered with its error, and the others go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Histogram

from services.app.compensation import Attempt, Compensation
from services.app.queue_state import QueueState
from services.domain import events as mail_events
from services.domain import model, trace, validation
from services.domain.errors import Aborted, PublishersBlocked
from services.domain.events import Actor, current_actor
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

#: A producer's (deliver_at, delay), at most one set (services/domain/validation.py ``deliver_at``).
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
    #: Small inline content (up to ``MAILQUEUE_SMALL_BLOB_BYTES``), also carried by its RabbitMQ
    #: message so its delivery reads no blob (services/domain/settings.py ``carried``).
    carried: bytes | None = None
    blob_ids: tuple[str, ...] = ()
    size: int = 0
    #: With an idempotency key: the claimed enqueue id, this attempt's claim instant, and the
    #: instant the mail is enqueued at: the first attempt's claim (a taken-over attempt's row is
    #: written again, in its partition and place, not a second row beside it).
    key: str = ""
    enqueue_id: uuid.UUID | None = None
    started: dt.datetime | None = None
    at: dt.datetime | None = None
    #: Its claim was taken over from an earlier attempt (``at`` is that attempt's instant): undone,
    #: its enqueue id is marked though this attempt wrote nothing (services/app/compensation.py).
    taken_over: bool = False
    #: The call's trace context and its caller (the actor of its ENQUEUED event), taken when it is
    #: made: the group runs in another call's task, with that call's context.
    traceparent: str = dataclasses.field(default_factory=trace.current_traceparent.get)
    actor: Actor = dataclasses.field(default_factory=current_actor.get)


class GroupWrites:
    def __init__(self, view: View, broker: Broker, blobs: BlobStore, state: QueueState, events: EventLog,
                 compensation: Compensation) -> None:
        self._view, self._broker, self._blobs, self._state = view, broker, blobs, state
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
        fresh = iter(mail_events.new_ids(sum(1 for it in items if it.enqueue_id is None)))
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
                await self._view.mails.count(queued[i], enqueued=1, delayed=1 if queued[i].deliver_at is not None else 0)
                attempts[i].counted = True
            sent = await asyncio.gather(*(self._broker.publish(
                queued[i],
                queued[i].deliver_at - queued[i].enqueued_at if queued[i].deliver_at is not None else dt.timedelta(0),
                content=items[i].carried,
            ) for i in live), return_exceptions=True)
            live = _survivors(live, sent, failed)
            if live:  # the group's ENQUEUED events in one record; unrecorded, the mails are undone
                try:
                    await self._events.record([mail_events.enqueued(queued[i], items[i].actor) for i in live])
                except Exception as e:  # noqa: BLE001 - each mail answered with the error, and undone
                    for i in live:
                        failed(i, e)
                    live = []
            keyed = [i for i in live if items[i].key]
            held = await asyncio.gather(*(self._compensation.commit(items[i].queue, items[i].key, queued[i], started[i])
                                          for i in keyed))
            for i, ours in zip(keyed, held, strict=True):
                if not ours:  # a retry took the claim over: it answers for the key, this attempt is undone
                    failed(i, Aborted(f"the enqueue with idempotency key {validation.shown(items[i].key)} was taken "
                                      "over by a retry of it (this attempt was taken for gone): the retry answers for it"))
            live = [i for i in live if out[i] is None]
        except BaseException as e:  # cancelled (the server stopping): every mail not answered is undone
            for i in range(len(items)):
                if out[i] is None:
                    failed(i, e)
            raise
        finally:
            undo = [self._compensation.undo(it.queue, it.key, ids[i], started[i], attempts.get(i, Attempt(taken_over=it.taken_over)))
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
        now = it.at or model.utcnow()
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
            deliver_at=validation.deliver_at(now, *it.when), priority=it.priority, traceparent=it.traceparent,
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


# ---------------------------------------------------------------------- forming the groups
GROUP = Histogram("mailqueue_enqueue_grouped_calls", "Enqueues run together as one group",
                  buckets=(1, 2, 4, 8, 16, 32, 64, 128))

#: A waiting call: its mail, its answer, and what to call when its group starts.
Entry = tuple[Pending, asyncio.Future[model.EnqueueResult], Callable[[], None]]


class Grouper:
    def __init__(self, writes: GroupWrites, compensation: Compensation, running: int = 1, size: int = 128) -> None:
        self._writes, self._compensation = writes, compensation
        self.running, self.size = running, size
        self._waiting: list[Entry] = []
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, item: Pending, started: Callable[[], None] = lambda: None) -> model.EnqueueResult:
        """The outcome of ``item``, run in a group (its error raised as the call's own);
        ``started`` is called when its group starts (from then on it goes on whatever its caller
        does: a caller that leaves before takes it out, nothing written)."""
        answer: asyncio.Future[model.EnqueueResult] = asyncio.get_running_loop().create_future()
        entry = (item, answer, started)
        if not self._waiting and len(self._running) < self.running:  # a lone call: a group of one, at once
            self._start([entry])
        else:
            self._waiting.append(entry)
            if len(self._running) < self.running:
                self._next()
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if entry in self._waiting:  # not started: nothing of it is written; its claim is released
                self._waiting.remove(entry)
                if item.key:
                    self._compensation.undo_later(item.queue, item.key, item.enqueue_id, item.started, item.taken_over)
            raise

    def _next(self) -> None:
        group, self._waiting = self._waiting[:self.size], self._waiting[self.size:]
        if group:
            self._start(group)

    def _start(self, group: list[Entry]) -> None:
        GROUP.observe(len(group))
        for _, _, started in group:
            started()
        task = asyncio.ensure_future(self._run(group))
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._waiting and len(self._running) < self.running:
            self._next()

    async def _run(self, group: list[Entry]) -> None:
        items = [item for item, _, _ in group]
        try:
            outcomes = await self._writes.run_group(items)
        except BaseException as e:  # noqa: BLE001 - every caller of the group gets it
            outcomes = [e] * len(group)
        for (_, answer, _), outcome in zip(group, outcomes, strict=True):
            if answer.done():
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
                answer.add_done_callback(_retrieved)
            else:
                answer.set_result(outcome)


def _retrieved(f: asyncio.Future) -> None:
    """A caller that left does not read its answer: its error is not 'never retrieved'."""
    if not f.cancelled():
        f.exception()


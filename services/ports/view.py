"""The view as the use-cases see it: the time-series view of the queues (DESIGN §2-§4) and the
small stores beside it. The use-cases (services/app/) depend on these interfaces only; the
Cassandra adapter (services/adapters/cassandra/view.py) implements them with one DAO per table.

``MailQueueView`` is shaped like James's: store a mail, mark it gone, ask why it is gone (or its
current schedule), read the live mails, tell the size; it gives domain objects back.
"""

from __future__ import annotations

import abc
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from services.domain import counts, dead_letters, model, paging
from services.ports.quotas import QuotaStore
from services.ports.shaping import ShapingStore


class MailQueueView(abc.ABC):
    @abc.abstractmethod
    async def store(self, mail: model.QueuedMail) -> None:
        """Write the mail's row (it becomes browsable; its message is published after)."""

    @abc.abstractmethod
    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        """The mail is gone (dequeued, deleted, dead-lettered, expired): browse and dequeue skip it.
        ``written_at``: the mark's write time (last write wins), for an enqueue's undo."""

    @abc.abstractmethod
    async def mark_if_live(self, queue: str, enqueue_id: uuid.UUID, reason: str) -> str | None:
        """Mark the mail gone unless something marked it meanwhile: None when marked now, else the
        reason of the mark it has (an answer that must not undo an operator's delete)."""

    @abc.abstractmethod
    async def mark_gone(
        self, q: model.QueuedMail, reason: str, now: dt.datetime | None = None, written_at: dt.datetime | None = None,
    ) -> None:
        """``mark`` a live mail, with its slice counters as of ``now``: ``gone``, and a mail still
        waiting for its delay also leaves the delayed (and held) counts."""

    @abc.abstractmethod
    async def mark_gone_if_live(self, q: model.QueuedMail, reason: str) -> str | None:
        """``mark_if_live``, with its slice counters when marked now; nothing counted when it was
        marked meanwhile (the earlier mark counted it)."""

    @abc.abstractmethod
    async def count(self, q: model.QueuedMail, **deltas: int) -> None:
        """Add ``deltas`` (kind=delta, services/domain/counts.py) to the mail's slice counters,
        with its ``bytes`` (its size with ``enqueued``, minus it with ``gone``). Best effort:
        gathered in the process for a moment, never failing the caller (the mail is durable already)."""

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
    async def reschedule(self, mail: model.QueuedMail, unpublished: bool = False) -> None:
        """Record the mail's new schedule (generation, deliver_at, attempts, last error, hold);
        ``unpublished``: its message is not published yet (``MailState.unpublished`` until
        ``published``), for a writer that may be cut between the two."""

    @abc.abstractmethod
    async def land(self, mail: model.QueuedMail) -> model.MailState | None:
        """Record the schedule of a mail landing whole in its queue (a move's copy, a redrive)
        unless the view has its mark or schedule already: None when recorded now, by this call;
        else the state the view has."""

    @abc.abstractmethod
    async def published(self, mail: model.QueuedMail) -> None:
        """The message of a landed mail (or of one put back, ``reschedule(unpublished=True)``) is
        published: ``MailState.unpublished`` no longer."""

    @abc.abstractmethod
    def live_pages(
        self, queue: str, slice_start: dt.datetime, buckets: int, op: str, first_page: int = 100, max_page: int = 5000,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> AsyncIterator[list[model.QueuedMail]]:
        """The live mails of one slice, every bucket merged in enqueue order, each with its current
        schedule, lazily in pages: the first costs about ``buckets x first_page`` rows read whatever
        the slice holds, so a first Browse page stays cheap at any depth; pages double up to
        ``max_page``. ``after``: only the mails after this (enqueued_at, enqueue_id) in enqueue
        order (a page token's position), read from there: as cheap as a first page. ``op`` labels
        the reads in the metrics (browse, size, delete, ...)."""

    @abc.abstractmethod
    async def indexed(self, queue: str, column: str, value: Any, op: str) -> list[model.QueuedMail] | None:
        """The live mails whose ``column`` ("name" or "enqueue_id") is ``value``, in enqueue order,
        from an index: the rows read are those, whatever the queue holds. None when the index
        cannot answer (missing, building): the caller scans instead."""

    @abc.abstractmethod
    async def index_rows(self, queue: str, column: str, value: Any, op: str) -> list[model.QueuedMail] | None:
        """``indexed`` without the liveness check: the rows the index finds, in enqueue order, no
        deleted mark read (``live`` reads them for the rows a caller keeps). None as ``indexed``."""

    @abc.abstractmethod
    async def live(self, queue: str, rows: list[model.QueuedMail], op: str) -> list[model.QueuedMail]:
        """Those of ``rows`` not deleted, in their order, each with its current schedule: one
        deleted-mark read per row."""

    @abc.abstractmethod
    async def size(self, queue: str) -> counts.Counts:
        """Live, delayed and held mails from browse start, from the slice counters."""


class Starts(Protocol):
    """Browse start and content start of each queue (DESIGN §4)."""

    async def initialise(self, queue: str, start: dt.datetime) -> None: ...
    async def browse_start(self, queue: str) -> dt.datetime | None: ...
    async def content_start(self, queue: str) -> dt.datetime | None: ...
    async def set_browse_start(self, queue: str, start: dt.datetime) -> None: ...
    async def advance_content_start(self, queue: str, start: dt.datetime) -> dt.datetime: ...


class Queues(Protocol):
    async def create(self, queue: str) -> bool: ...
    async def exists(self, queue: str) -> bool: ...
    async def all(self) -> list[str]: ...
    async def drop(self, queue: str) -> None: ...
    async def restore(self, queue: str) -> None: ...
    async def drop_done(self, queue: str) -> None: ...
    async def deleted_at(self, queue: str) -> dt.datetime | None: ...
    async def dropped(self, queue: str) -> bool: ...
    async def dropped_at(self, queue: str) -> dt.datetime | None: ...
    async def all_dropped(self) -> list[str]: ...


class RetryPolicies(Protocol):
    async def set(self, queue: str, p: model.RetryPolicy) -> None: ...
    async def delete(self, queue: str) -> None: ...
    async def get(self, queue: str) -> model.RetryPolicy: ...

    async def written(self, queue: str) -> int:
        """When the policy was last set (microseconds); 0 while the queue has the defaults."""
        ...


class Rules(Protocol):
    """The operator rules (hold, bounce) in force."""

    async def add(self, r: model.Rule) -> None: ...
    async def all(self) -> list[model.Rule]: ...
    async def get(self, rule_id: uuid.UUID) -> model.Rule | None: ...
    async def lift(self, rule_id: uuid.UUID) -> None: ...


class Counters(Protocol):
    """The slice counters (services/domain/counts.py)."""

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None: ...
    async def read(self, queue: str, kinds: tuple[str, ...], since: dt.datetime) -> dict[str, dict[dt.datetime, int]]: ...


class CounterBuffer(Protocol):
    """Counter updates gathered in the process for a moment, one update per key."""

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None: ...
    async def flush(self) -> None: ...


class Idempotency(Protocol):
    """Idempotency keys: a claim per (queue, key), committed with its mail or released. An
    uncommitted claim names its owner (an ``Enqueuers`` lease), when the enqueuer that made it had one."""

    async def claim(self, queue: str, key: str, enqueue_id: uuid.UUID, now: dt.datetime,
                    owner: uuid.UUID | None = None) -> model.IdempotencyClaim | None: ...
    async def take_over(self, queue: str, key: str, now: dt.datetime, seen: dt.datetime,
                        owner: uuid.UUID | None = None, enqueue_id: uuid.UUID | None = None,
                        enqueued_at: dt.datetime | None = None) -> bool: ...
    async def commit(self, queue: str, key: str, q: model.QueuedMail, claimed_at: dt.datetime) -> bool: ...
    async def committed(self, queue: str, key: str) -> model.EnqueueResult | None: ...
    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID, claimed_at: dt.datetime) -> None: ...


class Enqueuers(Protocol):
    """A lease per enqueue process, renewed while it runs and gone within its TTL once it died."""

    async def renew(self, enqueuer: uuid.UUID, host: str, ttl_s: int) -> None: ...
    async def alive(self, enqueuer: uuid.UUID) -> bool: ...


class Moves(Protocol):
    """The journal of MoveMails (services/app/moves.py): a move begun and not yet done, per source queue."""

    async def begin(self, mail: model.QueuedMail, moved: model.QueuedMail) -> None: ...
    async def pending(self, source: str) -> list[tuple[model.QueuedMail, model.QueuedMail, dt.datetime]]:
        """(the mail, the mail as it lands in the target, when the move was begun)."""
    async def done(self, mail: model.QueuedMail) -> None: ...


class DeadLetters(Protocol):
    """The dead-letter repository (services/adapters/cassandra/dead_letters_store.py)."""

    async def record(self, d: dead_letters.DeadLetter) -> bool: ...
    def scan(self, queue: str, after: paging.Position | None = None) -> AsyncIterator[dead_letters.DeadLetter]: ...
    async def remove(self, q: model.QueuedMail) -> bool: ...
    async def counts(self, queue: str) -> dict[str, int]: ...
    async def exact_counts(self, queue: str) -> dict[str, int]: ...
    async def correct(self, queue: str, kind: str, delta: int) -> None: ...


class Leases(Protocol):
    """Background work one replica does at a time."""

    async def hold(self, name: str, holder: str, ttl_s: int) -> bool: ...

    async def release(self, name: str, holder: str) -> None: ...


class ViewConfiguration(Protocol):
    """The view configuration (slice window, buckets, browse start pace): services/domain/view_config.py."""

    async def current(self) -> model.ViewConfig: ...
    async def apply(
        self, wanted: model.ViewConfig, before_write: Callable[[model.ViewConfig, int], Awaitable[None]] | None = None,
    ) -> model.ViewConfig:
        """``before_write(current, number)``: the change's number (one more than the current's)."""


class View(Protocol):
    """Everything the use-cases read and write besides the broker and the blobs."""

    mails: MailQueueView
    starts: Starts
    queues: Queues
    retry_policies: RetryPolicies
    rules: Rules
    counters: Counters
    counter_buffer: CounterBuffer
    idempotency: Idempotency
    enqueuers: Enqueuers
    config: ViewConfiguration
    shaping: ShapingStore
    quotas: QuotaStore
    moves: Moves
    leases: Leases
    dead_letters: DeadLetters

    async def ping(self) -> None: ...
    def close(self) -> None: ...

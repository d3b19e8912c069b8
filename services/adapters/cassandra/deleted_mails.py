"""``deleted_mails``: the deleted marks ("this mail is gone"), or a mail's schedule while it lives.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE

from services.adapters.cassandra import schema
from services.adapters.cassandra.cells import micros, unset_if_empty, utc
from services.adapters.cassandra.group_commit import CROSS_PARTITION_IN_FLIGHT, CROSS_PARTITION_STATEMENTS, GroupCommit
from services.adapters.cassandra.group_read import GroupRead
from services.adapters.cassandra.session import execute
from services.domain import model


class DeletedMailsDAO:
    """``deleted_mails``: "this mail is gone", or its schedule while it lives.

    A mark sets ``reason`` and ``deleted_at`` (the retention sweep tells marks by ``deleted_at``);
    a schedule change sets only the schedule columns, so it never hides nor revives a mark.
    """

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.DELETED_MAILS}"
        self._mark = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, ?, ?)"
        )
        self._mark_at = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"
        )
        # A consumer's dead-lettering answer marks only a mail nobody marked meanwhile (an operator's
        # delete, a delivery): a lightweight transaction, on the rare paths only (REJECT, expiry).
        self._mark_if_live = session.prepare(
            f"UPDATE {t} SET reason = ?, deleted_at = ? WHERE queue_name = ? AND enqueue_id = ? "
            "IF reason = null AND deleted_at = null"
        )
        self._unmark = session.prepare(
            f"DELETE reason, deleted_at FROM {t} USING TIMESTAMP ? WHERE queue_name = ? AND enqueue_id = ?"
        )
        self._schedule = session.prepare(
            f"UPDATE {t} SET generation = ?, deliver_at = ?, attempts = ?, last_error = ?, held_by = ? "
            "WHERE queue_name = ? AND enqueue_id = ?"
        )
        self._schedule_unpublished = session.prepare(
            f"UPDATE {t} SET generation = ?, deliver_at = ?, attempts = ?, last_error = ?, held_by = ?, published = false "
            "WHERE queue_name = ? AND enqueue_id = ?"
        )
        # A mail landing whole (a move's copy, a redriven dead letter) writes its schedule only if it
        # has no row yet: of two movers of one mail (or one completed again), one lands it.
        self._land = session.prepare(
            f"INSERT INTO {t} (queue_name, enqueue_id, generation, deliver_at, attempts, last_error, published) "
            "VALUES (?, ?, ?, ?, ?, ?, false) IF NOT EXISTS"
        )
        self._published = session.prepare(f"UPDATE {t} SET published = true WHERE queue_name = ? AND enqueue_id = ?")
        self._get_many = session.prepare(
            f"SELECT enqueue_id, reason, deleted_at, generation, deliver_at, attempts, last_error, held_by, published FROM {t} "
            "WHERE queue_name = ? AND enqueue_id IN ?"
        )
        self._reads = GroupRead(self._fetch)
        #: Marks of one queue that meet in time share a request (a delivery's SUCCESS, a burst's).
        self._marks = GroupCommit(session, CROSS_PARTITION_STATEMENTS, CROSS_PARTITION_IN_FLIGHT)

    async def mark(self, queue: str, enqueue_id: uuid.UUID, reason: str, written_at: dt.datetime | None = None) -> None:
        """Mark the mail gone. ``written_at``: the mark's write time in Cassandra (last write
        wins), for an undo that must lose against a later ``unmark`` even when it lands later."""
        if written_at is None:
            await self._marks.execute(queue, self._mark, (queue, enqueue_id, reason, model.utcnow()))
        else:
            await self._marks.execute(queue, self._mark_at, (queue, enqueue_id, reason, written_at, micros(written_at)))

    async def mark_if_live(self, queue: str, enqueue_id: uuid.UUID, reason: str) -> str | None:
        """Mark the mail gone unless it is marked already: None when marked now, else the reason
        of the mark it has (one lightweight transaction, never grouped)."""
        r = (await execute(self._session, self._mark_if_live, (reason, model.utcnow(), queue, enqueue_id)))[0]
        if r.applied:
            return None
        return r.reason or "deleted"

    async def unmark(self, queue: str, enqueue_id: uuid.UUID, at: dt.datetime) -> None:
        """Remove a mark written before ``at`` (one written after it stays)."""
        await execute(self._session, self._unmark, (micros(at), queue, enqueue_id))

    async def schedule(self, q: model.QueuedMail, unpublished: bool = False) -> None:
        """Record the mail's new schedule (generation, deliver_at, attempts, last error); with
        ``unpublished``, marked not published until ``published``."""
        # Empty values stay unset (no null cells): a held_by left from an earlier hold only counts
        # while its rule is in force and the mail is not yet due (services/domain/rules.py).
        await execute(self._session, self._schedule_unpublished if unpublished else self._schedule, (
            q.generation, q.due(), q.attempts, unset_if_empty(q.last_error),
            q.held_by if q.held_by is not None else UNSET_VALUE, q.queue, q.enqueue_id,
        ))

    async def land(self, q: model.QueuedMail) -> model.MailState | None:
        """Record the schedule of a mail that lands in its queue whole, unless it has a row (a mark
        or a schedule) already: None when recorded now, else the state found (one lightweight
        transaction, whose refusal carries the row)."""
        r = (await execute(self._session, self._land, (
            q.queue, q.enqueue_id, q.generation, q.due(), q.attempts, unset_if_empty(q.last_error))))[0]
        return None if r.applied else _state(r)

    async def published(self, q: model.QueuedMail) -> None:
        """The landed mail's message is published (``land``): a completion does not publish it again."""
        await execute(self._session, self._published, (q.queue, q.enqueue_id))

    async def _fetch(self, queue: str, enqueue_ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
        rows = await execute(self._session, self._get_many, (queue, enqueue_ids))
        return {r.enqueue_id: r for r in rows}

    async def state(self, queue: str, enqueue_id: uuid.UUID) -> model.MailState | None:
        """The mail's mark or schedule; None when the view has neither (live, as enqueued).
        Reads that meet in time share one request (services/adapters/cassandra/group_read.py)."""
        r = await self._reads.get(queue, enqueue_id)
        return _state(r) if r is not None else None


def _state(r: Any) -> model.MailState:
    """A row of the table as the mail's state."""
    gone = getattr(r, "deleted_at", None) is not None or getattr(r, "reason", None) is not None
    return model.MailState(
        reason=(r.reason or "deleted") if gone else None, generation=r.generation or 0,
        deliver_at=utc(r.deliver_at), attempts=r.attempts or 0, last_error=r.last_error or "", held_by=r.held_by,
        unpublished=getattr(r, "published", None) is False,
    )

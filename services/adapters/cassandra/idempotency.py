"""``enqueue_idempotency``: the claims of client idempotency keys.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt
import uuid

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.cells import unset_if_empty, utc
from services.adapters.cassandra.session import execute
from services.domain import model


class IdempotencyDAO:
    """``enqueue_idempotency``: a client key claims one enqueue id, committed once durable. An
    uncommitted claim names its owner, the lease (``enqueuers``) of the process whose attempt holds it."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.IDEMPOTENCY}"
        # A claim writes the instant its mail is enqueued at (enqueued_at, its own claim instant);
        # a take-over keeps it: every attempt writes the mail's view row in one place.
        self._claim = session.prepare(
            f"INSERT INTO {t} (queue_name, idempotency_key, enqueue_id, claimed_at, committed, owner, enqueued_at) "
            "VALUES (?, ?, ?, ?, false, ?, ?) IF NOT EXISTS"
        )
        # Each write sets the enqueue id again: a cell lives for the table's TTL from its own write,
        # and a claim's enqueue id expiring before the take-over's or the commit's cells left a row
        # answering "duplicate" with no enqueue id.
        self._take_over = session.prepare(
            f"UPDATE {t} SET claimed_at = ?, owner = ?, enqueue_id = ?, enqueued_at = ? WHERE queue_name = ? "
            "AND idempotency_key = ? IF committed = false AND claimed_at = ?"
        )
        # Only by the attempt that holds the claim: one whose claim was taken over since (its
        # attempt taken for gone: a lease lost, a pause past MAILQUEUE_ABANDONED_CLAIM_S) must not
        # answer for the key, whose mail the newer attempt may undo.
        self._commit = session.prepare(
            f"UPDATE {t} SET committed = true, enqueue_id = ?, enqueued_at = ?, blob_ids = ?, size = ? "
            "WHERE queue_name = ? AND idempotency_key = ? IF enqueue_id = ? AND claimed_at = ?"
        )
        self._remnant = session.prepare(f"DELETE FROM {t} WHERE queue_name = ? AND idempotency_key = ? IF enqueue_id = null")
        self._committed = session.prepare(
            f"SELECT enqueue_id, enqueued_at, blob_ids, size, committed FROM {t} WHERE queue_name = ? AND idempotency_key = ?")
        self._release = session.prepare(
            f"DELETE FROM {t} WHERE queue_name = ? AND idempotency_key = ? IF enqueue_id = ? AND claimed_at = ?"
        )

    async def claim(self, queue: str, key: str, enqueue_id: uuid.UUID, now: dt.datetime,
                    owner: uuid.UUID | None = None) -> model.IdempotencyClaim | None:
        """Claim ``key`` for ``enqueue_id`` (by ``owner``). None when claimed; otherwise who holds it."""
        claim = (queue, key, enqueue_id, now, unset_if_empty(owner), now)
        r = (await execute(self._session, self._claim, claim))[0]
        if not r.applied and r.enqueue_id is None:
            # What a row written before every write set the enqueue id leaves once it expired: no
            # claim of anything. Removed, then claimed as if absent.
            await execute(self._session, self._remnant, (queue, key))
            r = (await execute(self._session, self._claim, claim))[0]
        if r.applied:
            return None
        result = None
        if r.committed:
            result = model.EnqueueResult(r.enqueue_id, utc(r.enqueued_at), tuple(r.blob_ids or ()), r.size or 0, duplicate=True)
        return model.IdempotencyClaim(r.enqueue_id, utc(r.claimed_at), result, getattr(r, "owner", None),
                                      utc(r.enqueued_at) if r.enqueued_at is not None else None)

    async def committed(self, queue: str, key: str) -> model.EnqueueResult | None:
        """The committed enqueue of ``key`` (duplicate=True), or None (no claim, or not committed)."""
        rows = await execute(self._session, self._committed, (queue, key))
        if not rows or not rows[0].committed:
            return None
        r = rows[0]
        return model.EnqueueResult(r.enqueue_id, utc(r.enqueued_at), tuple(r.blob_ids or ()), r.size or 0, duplicate=True)

    async def take_over(self, queue: str, key: str, now: dt.datetime, seen: dt.datetime,
                        owner: uuid.UUID | None = None, enqueue_id: uuid.UUID | None = None,
                        enqueued_at: dt.datetime | None = None) -> bool:
        """Take over an abandoned, uncommitted claim (its enqueuer crashed or failed), keeping its
        enqueue id and the instant its mail is enqueued at: a copy the abandoned attempt published
        is then the same mail, in the same view row. ``owner`` holds it now."""
        rows = await execute(self._session, self._take_over, (now, unset_if_empty(owner), unset_if_empty(enqueue_id),
                                                              unset_if_empty(enqueued_at), queue, key, seen))
        r = rows[0]
        # Not applied, but to our time: a retry by the driver of a take-over that had applied.
        return bool(r.applied) or utc(getattr(r, "claimed_at", None)) == now

    async def commit(self, queue: str, key: str, q: model.QueuedMail, claimed_at: dt.datetime) -> bool:
        """Commit the claim made (or taken over) at ``claimed_at`` for ``q``: False when another
        attempt holds the key now (took the claim over), or it is released."""
        r = (await execute(self._session, self._commit, (q.enqueue_id, q.enqueued_at, unset_if_empty(list(q.blob_ids)),
                                                         q.size, queue, key, q.enqueue_id, claimed_at)))[0]
        # A retry by the driver of a commit that had applied applies again: nothing else changes a
        # committed claim (a take-over needs it uncommitted), but this attempt's own release.
        return bool(r.applied)

    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID, claimed_at: dt.datetime) -> None:
        """Release the claim this attempt made (a claim taken over since then is left alone)."""
        await execute(self._session, self._release, (queue, key, enqueue_id, claimed_at))

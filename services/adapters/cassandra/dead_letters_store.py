"""``dead_letters_v1`` and its index ``dead_letter_hours_v1``: the dead-letter repository.

A queue's dead letters are partitioned by the hour their mail was enqueued (a partition holds an
hour of a queue's mail at most, so it stays bounded however many die); the index lists the hours
a queue has used, so reading a queue's dead letters reads those partitions in order. Counts by
kind are Cassandra counters in ``queue_counters`` (kind ``dead_letters.<kind>``, one cell each).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all, execute_pages
from services.contract import serde
from services.domain import dead_letters, model, paging

#: The one slice cell the dead-letter counters use in ``queue_counters``.
COUNTER_SLICE = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def counter_kind(kind: str) -> str:
    return f"dead_letters.{kind}"


class DeadLettersStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t, h, c = (f"{keyspace}.{name}" for name in (schema.DEAD_LETTERS, schema.DEAD_LETTER_HOURS, schema.COUNTERS))
        self._put = session.prepare(
            f"INSERT INTO {t} (queue_name, hour, enqueued_at, enqueue_id, kind, reason, dead_at, blob_ids, body) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
        self._index = session.prepare(f"INSERT INTO {h} (queue_name, hour) VALUES (?, ?)")
        self._hours = session.prepare(f"SELECT hour FROM {h} WHERE queue_name = ?")
        self._get = session.prepare(
            f"SELECT kind FROM {t} WHERE queue_name = ? AND hour = ? AND enqueued_at = ? AND enqueue_id = ?")
        self._read = session.prepare(f"SELECT kind, reason, dead_at, body FROM {t} WHERE queue_name = ? AND hour = ?")
        # The rows of an hour after a position (a page token's): a clustering range, read from there on.
        self._read_after = session.prepare(f"SELECT kind, reason, dead_at, body FROM {t} WHERE queue_name = ? AND hour = ? "
                                           "AND (enqueued_at, enqueue_id) > (?, ?)")
        self._kinds = session.prepare(f"SELECT kind FROM {t} WHERE queue_name = ? AND hour = ?")
        self._remove = session.prepare(
            f"DELETE FROM {t} WHERE queue_name = ? AND hour = ? AND enqueued_at = ? AND enqueue_id = ?")
        self._count = session.prepare(f"UPDATE {c} SET count = count + ? WHERE queue_name = ? AND kind = ? AND slice_start = ?")
        self._counts = session.prepare(f"SELECT kind, count FROM {c} WHERE queue_name = ? AND kind IN ? AND slice_start = ?")

    async def record(self, d: dead_letters.DeadLetter) -> bool:
        """Keep a dead letter; False when it was kept already (a redelivered copy): counted once."""
        q = d.mail
        hour = dead_letters.hour_of(q.enqueued_at)
        if await execute(self._session, self._get, (q.queue, hour, q.enqueued_at, q.enqueue_id)):
            return False
        await execute(self._session, self._index, (q.queue, hour))
        await execute(self._session, self._put, (q.queue, hour, q.enqueued_at, q.enqueue_id, d.kind, d.reason, d.dead_at,
                                                 list(q.blob_ids), serde.queued_mail_to_bytes(q)))
        await self._add(q.queue, d.kind, 1)
        return True

    async def scan(self, queue: str, after: paging.Position | None = None) -> AsyncIterator[dead_letters.DeadLetter]:
        """Every dead letter of the queue, by hour of enqueue then enqueue time and id; read lazily,
        a page at a time (a first BrowseDeadLetters page reads about a page). ``after``: only those
        after this position (hour, enqueued_at, enqueue_id), read from there: as cheap as a first page."""
        for hour in await self._hour_list(queue):
            if after is not None and hour < after.partition:
                continue
            statement, params = ((self._read_after, (queue, hour, after.enqueued_at, after.id))
                                 if after is not None and hour == after.partition else (self._read, (queue, hour)))
            async for rows in execute_pages(self._session, statement, params):
                for r in rows:
                    yield dead_letters.DeadLetter(serde.queued_mail_from_bytes(r.body), r.kind, r.reason, _utc(r.dead_at))

    async def remove(self, q: model.QueuedMail) -> bool:
        """Forget the dead letter of this mail (redriven or purged), its count with it; False when
        it was gone already."""
        key = (q.queue, dead_letters.hour_of(q.enqueued_at), q.enqueued_at, q.enqueue_id)
        rows = await execute(self._session, self._get, key)
        if not rows:
            return False
        await execute(self._session, self._remove, key)
        await self._add(q.queue, rows[0].kind, -1)
        return True

    async def counts(self, queue: str) -> dict[str, int]:
        """Dead letters by kind, from the counters (one partition read)."""
        rows = await execute(self._session, self._counts, (queue, [counter_kind(k) for k in dead_letters.KINDS], COUNTER_SLICE))
        found = {r.kind.removeprefix("dead_letters."): r.count for r in rows}
        return {k: found.get(k, 0) for k in dead_letters.KINDS}

    async def exact_counts(self, queue: str) -> dict[str, int]:
        """Dead letters by kind, read from the repository (its kind column only)."""
        exact = dict.fromkeys(dead_letters.KINDS, 0)
        for hour in await self._hour_list(queue):
            for r in await execute_all(self._session, self._kinds, (queue, hour)):
                exact[r.kind] = exact.get(r.kind, 0) + 1
        return exact

    async def correct(self, queue: str, kind: str, delta: int) -> None:
        await self._add(queue, kind, delta)

    async def _add(self, queue: str, kind: str, delta: int) -> None:
        await execute(self._session, self._count, (delta, queue, counter_kind(kind), COUNTER_SLICE))

    async def _hour_list(self, queue: str) -> list[int]:
        return [r.hour for r in await execute_all(self._session, self._hours, (queue,))]


def _utc(instant: dt.datetime) -> dt.datetime:
    return instant.replace(tzinfo=dt.timezone.utc) if instant.tzinfo is None else instant


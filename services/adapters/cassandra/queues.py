"""``queues``: the set of queues.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.domain import model


class QueuesDAO:
    """``queues``: the set of queues."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.QUEUES}"
        self._create = session.prepare(f"INSERT INTO {t} (queue_name, created_at) VALUES (?, ?) IF NOT EXISTS")
        self._exists = session.prepare(f"SELECT queue_name FROM {t} WHERE queue_name = ?")
        self._all = f"SELECT queue_name FROM {t}"
        self._delete = session.prepare(f"DELETE FROM {t} WHERE queue_name = ? IF EXISTS")
        dropped = f"{keyspace}.{schema.DROPPED_QUEUES}"
        self._drop = session.prepare(f"INSERT INTO {dropped} (queue_name, dropped_at, done_at) VALUES (?, ?, null)")
        self._done = session.prepare(f"UPDATE {dropped} SET done_at = ? WHERE queue_name = ?")
        self._undrop = session.prepare(f"DELETE FROM {dropped} WHERE queue_name = ?")
        self._is_dropped = session.prepare(f"SELECT queue_name, dropped_at, done_at FROM {dropped} WHERE queue_name = ?")
        self._all_dropped = f"SELECT queue_name FROM {dropped}"

    async def create(self, queue: str) -> bool:
        """True when the queue is new."""
        rows = await execute(self._session, self._create, (queue, model.utcnow()))
        return bool(rows and rows[0].applied)

    async def exists(self, queue: str) -> bool:
        return bool(await execute(self._session, self._exists, (queue,)))

    async def all(self) -> list[str]:
        return sorted(r.queue_name for r in await execute_all(self._session, self._all))

    async def drop(self, queue: str) -> None:
        """Recorded as dropped (for the retention sweep), then no longer listed nor accepting mail."""
        await execute(self._session, self._drop, (queue, model.utcnow()))
        await execute(self._session, self._delete, (queue,))

    async def restore(self, queue: str) -> None:
        """Undo ``drop`` (a delete refused after it)."""
        await execute(self._session, self._create, (queue, model.utcnow()))
        await execute(self._session, self._undrop, (queue,))

    async def drop_done(self, queue: str) -> None:
        """The deletion of the dropped ``queue`` completed: a DeleteQueue of the name finds nothing to do."""
        await execute(self._session, self._done, (model.utcnow(), queue))

    async def deleted_at(self, queue: str) -> dt.datetime | None:
        """When the deletion of the dropped queue of that name completed (None: it did not, or the
        name was never dropped, or it was dropped before deletions were recorded complete)."""
        rows = await execute(self._session, self._is_dropped, (queue,))
        return rows[0].done_at.replace(tzinfo=dt.timezone.utc) if rows and rows[0].done_at else None

    async def dropped(self, queue: str) -> bool:
        return bool(await execute(self._session, self._is_dropped, (queue,)))

    async def dropped_at(self, queue: str) -> dt.datetime | None:
        """When the queue of that name was last dropped (None: never; a queue made again keeps it)."""
        rows = await execute(self._session, self._is_dropped, (queue,))
        return rows[0].dropped_at.replace(tzinfo=dt.timezone.utc) if rows and rows[0].dropped_at else None

    async def all_dropped(self) -> list[str]:
        return sorted(r.queue_name for r in await execute_all(self._session, self._all_dropped))

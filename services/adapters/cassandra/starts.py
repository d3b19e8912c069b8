"""``browse_start`` and ``content_start``: one instant per queue each.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute


class StartsDAO:
    """``browse_start`` and ``content_start``: one instant per queue each."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        b, c = f"{keyspace}.{schema.BROWSE_START}", f"{keyspace}.{schema.CONTENT_START}"
        self._init_browse = session.prepare(
            f"INSERT INTO {b} (queue_name, browse_start) VALUES (?, ?) IF NOT EXISTS"
        )
        self._init_content = session.prepare(
            f"INSERT INTO {c} (queue_name, content_start) VALUES (?, ?) IF NOT EXISTS"
        )
        self._get_browse = session.prepare(f"SELECT browse_start FROM {b} WHERE queue_name = ?")
        self._get_content = session.prepare(f"SELECT content_start FROM {c} WHERE queue_name = ?")
        self._set_browse = session.prepare(f"UPDATE {b} SET browse_start = ? WHERE queue_name = ?")
        self._advance_content = session.prepare(
            f"UPDATE {c} SET content_start = ? WHERE queue_name = ? IF content_start = ?"
        )

    async def initialise(self, queue: str, start: dt.datetime) -> None:
        await execute(self._session, self._init_browse, (queue, start))
        await execute(self._session, self._init_content, (queue, start))

    async def browse_start(self, queue: str) -> dt.datetime | None:
        rows = await execute(self._session, self._get_browse, (queue,))
        return rows[0].browse_start.replace(tzinfo=dt.timezone.utc) if rows and rows[0].browse_start else None

    async def content_start(self, queue: str) -> dt.datetime | None:
        rows = await execute(self._session, self._get_content, (queue,))
        return rows[0].content_start.replace(tzinfo=dt.timezone.utc) if rows and rows[0].content_start else None

    async def set_browse_start(self, queue: str, start: dt.datetime) -> None:
        await execute(self._session, self._set_browse, (start, queue))

    async def advance_content_start(self, queue: str, start: dt.datetime) -> dt.datetime:
        """Move content start forward to ``start`` (never back), with a lightweight transaction
        so that two sweeps racing cannot move it backwards. Returns the content start in force."""
        while True:
            current = await self.content_start(queue)
            if current is not None and current >= start:
                return current
            rows = await execute(self._session, self._advance_content, (start, queue, current))
            if rows and rows[0][0]:
                return start

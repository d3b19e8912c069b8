"""``queue_counters``: per queue, per kind, per enqueue slice.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import asyncio
import datetime as dt

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.cells import utc
from services.adapters.cassandra.session import execute, execute_all


class CountersDAO:
    """``queue_counters``: per queue, per kind, per enqueue slice. Cassandra counters: an update
    that times out may or may not have applied, so they drift; ReconcileCounters heals them."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.COUNTERS}"
        self._add = session.prepare(f"UPDATE {t} SET count = count + ? WHERE queue_name = ? AND kind = ? AND slice_start = ?")
        self._read = session.prepare(
            f"SELECT slice_start, count FROM {t} WHERE queue_name = ? AND kind = ? AND slice_start >= ?")

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None:
        await execute(self._session, self._add, (delta, queue, kind, slice_start))

    async def read(self, queue: str, kinds: tuple[str, ...], since: dt.datetime) -> dict[str, dict[dt.datetime, int]]:
        """kind -> slice start -> count, for the slices from ``since`` (one partition, one range per kind:
        the queue's history before ``since`` is not read)."""
        parts = await asyncio.gather(*(execute_all(self._session, self._read, (queue, k, since)) for k in kinds))
        return {k: {utc(r.slice_start): r.count for r in rows} for k, rows in zip(kinds, parts)}

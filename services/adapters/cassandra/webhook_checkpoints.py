"""``webhook_checkpoints_v1``: per webhook endpoint, the cursor of the last event it took; one
row per endpoint, overwritten (no tombstones)."""

from __future__ import annotations

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute


class CassandraCheckpoints:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.WEBHOOK_CHECKPOINTS}"
        self._save = session.prepare(f"INSERT INTO {t} (endpoint, cursor, updated) VALUES (?, ?, toTimestamp(now()))")
        self._load = session.prepare(f"SELECT cursor FROM {t} WHERE endpoint = ?")

    async def load(self, endpoint: str) -> str | None:
        rows = await execute(self._session, self._load, (endpoint,))
        return rows[0].cursor if rows else None

    async def save(self, endpoint: str, cursor: str) -> None:
        await execute(self._session, self._save, (endpoint, cursor))

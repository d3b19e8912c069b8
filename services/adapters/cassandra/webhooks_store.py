"""``webhooks_v1``: the registered webhook endpoints (services/ports/webhooks.py ``Registry``).

One partition (``part`` 0) holds them all: webhook_svc reads it whole every few seconds. Add and
remove are lightweight transactions, so two operators adding one name get one ALREADY_EXISTS.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.domain.events import EventType
from services.domain.webhook_registry import Registration

PART = 0
_COLUMNS = "name, url, secret_file, types, queues, max_age_s, from_oldest, created_at"


def _registration(r: Any) -> Registration:
    created = r.created_at.replace(tzinfo=dt.timezone.utc) if r.created_at else None
    return Registration(r.name, r.url, r.secret_file, tuple(EventType(t) for t in r.types or ()), tuple(r.queues or ()),
                        r.max_age_s, bool(r.from_oldest), created)


class CassandraWebhooks:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.WEBHOOKS}"
        self._add = session.prepare(f"INSERT INTO {t} (part, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS")
        self._get = session.prepare(f"SELECT {_COLUMNS} FROM {t} WHERE part = ? AND name = ?")
        self._all = session.prepare(f"SELECT {_COLUMNS} FROM {t} WHERE part = ?")
        self._remove = session.prepare(f"DELETE FROM {t} WHERE part = ? AND name = ? IF EXISTS")

    async def add(self, r: Registration) -> bool:
        rows = await execute(self._session, self._add, (
            PART, r.name, r.url, r.secret_file, [t.value for t in r.types] or UNSET_VALUE, list(r.queues) or UNSET_VALUE,
            r.max_age_s, r.from_oldest, r.created_at))
        return bool(rows[0].applied)

    async def get(self, name: str) -> Registration | None:
        rows = await execute(self._session, self._get, (PART, name))
        return _registration(rows[0]) if rows else None

    async def remove(self, name: str) -> Registration | None:
        before = await self.get(name)
        if before is None:
            return None
        rows = await execute(self._session, self._remove, (PART, name))
        return before if rows[0].applied else None

    async def all(self) -> list[Registration]:
        return sorted((_registration(r) for r in await execute_all(self._session, self._all, (PART,))), key=lambda r: r.name)

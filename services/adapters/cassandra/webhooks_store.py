"""``webhooks_v1``: the registered webhook endpoints (services/ports/webhooks.py ``Registry``).

One partition (``part`` 0) holds them all: webhook_svc reads it whole every few seconds. Add and
remove are lightweight transactions, so two operators adding one name get one ALREADY_EXISTS.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.domain.events import EventType
from services.domain.webhook_registry import Registration

log = logging.getLogger(__name__)

PART = 0
_COLUMNS = "name, url, secret_file, types, queues, max_age_s, from_oldest, created_at"


_KNOWN = {t.value for t in EventType}
#: The endpoints whose unknown types were logged.
_WARNED: set[str] = set()


def _registration(r: Any) -> Registration:
    """The row as a registration. Event types this version does not know (a newer replica
    registered them, during a rolling update or after a downgrade) are left out of its filter:
    this version records none of them. One unknown type failed the whole read: ListWebhooks
    INTERNAL, and webhook_svc delivering to no endpoint."""
    created = r.created_at.replace(tzinfo=dt.timezone.utc) if r.created_at else None
    types = tuple(EventType(t) for t in r.types or () if t in _KNOWN)
    return Registration(r.name, r.url, r.secret_file, types, tuple(r.queues or ()), r.max_age_s, bool(r.from_oldest), created)


def _served(r: Any) -> bool:
    """Whether this version serves the row: not when it names event types only this version does
    not know (with them left out its filter would be empty: every event). Logged."""
    unknown = [t for t in r.types or () if t not in _KNOWN]
    if unknown:
        served = len(unknown) < len(r.types)
        if r.name in _WARNED:  # once per endpoint and process, not at every reload
            return served
        _WARNED.add(r.name)
        log.warning("webhook endpoint %s names event types this version does not know: %s%s", r.name, ", ".join(unknown),
                    "" if served else " (and no other: left out until a version that knows them serves it)",
                    extra={"endpoint": r.name})
        return served
    return True


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
        rows = await execute_all(self._session, self._all, (PART,))
        return sorted((_registration(r) for r in rows if _served(r)), key=lambda r: r.name)

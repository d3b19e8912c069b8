"""``rules``: the operators' hold and bounce rules.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import uuid
from typing import Any

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.cells import unset_if_empty, utc
from services.adapters.cassandra.session import execute, execute_all
from services.domain import model


class RulesDAO:
    """``rules``: the operators' hold and bounce rules, one partition, TTL to each rule's expiry."""

    SCOPE = "all"
    COLUMNS = "rule_id, kind, queue_name, recipient_domain, sender, name, reason, created_at, expires_at"

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.RULES}"
        self._add = session.prepare(f"INSERT INTO {t} (scope, {self.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        self._all = session.prepare(f"SELECT {self.COLUMNS} FROM {t} WHERE scope = ?")
        self._get = session.prepare(f"SELECT {self.COLUMNS} FROM {t} WHERE scope = ? AND rule_id = ?")
        self._lift = session.prepare(f"DELETE FROM {t} WHERE scope = ? AND rule_id = ?")

    async def add(self, r: model.Rule) -> None:
        ttl = max(1, int((r.expires_at - model.utcnow()).total_seconds()) + 1)
        await execute(self._session, self._add, (
            self.SCOPE, r.rule_id, r.kind, unset_if_empty(r.queue), unset_if_empty(r.recipient_domain),
            unset_if_empty(r.sender), unset_if_empty(r.name), unset_if_empty(r.reason), r.created_at, r.expires_at, ttl,
        ))

    async def all(self) -> list[model.Rule]:
        rows = await execute_all(self._session, self._all, (self.SCOPE,))
        return sorted((self._domain(r) for r in rows), key=lambda r: r.created_at)

    async def get(self, rule_id: uuid.UUID) -> model.Rule | None:
        rows = await execute(self._session, self._get, (self.SCOPE, rule_id))
        return self._domain(rows[0]) if rows else None

    async def lift(self, rule_id: uuid.UUID) -> None:
        await execute(self._session, self._lift, (self.SCOPE, rule_id))

    @staticmethod
    def _domain(r: Any) -> model.Rule:
        return model.Rule(
            rule_id=r.rule_id, kind=r.kind, expires_at=utc(r.expires_at), created_at=utc(r.created_at),
            queue=r.queue_name or "", recipient_domain=r.recipient_domain or "", sender=r.sender or "",
            name=r.name or "", reason=r.reason or "",
        )

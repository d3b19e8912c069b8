"""``retry_policies``: one row per queue that does not use the defaults.

The view's DAOs are one module per table; cells.py reads and writes their values."""

from __future__ import annotations

import datetime as dt

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.domain import model


class RetryPoliciesDAO:
    """``retry_policies``: one row per queue that does not use the defaults."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.RETRY_POLICIES}"
        self._set = session.prepare(
            f"INSERT INTO {t} (queue_name, initial_backoff_ms, multiplier, max_backoff_ms, max_attempts, max_age_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        self._get = session.prepare(
            f"SELECT initial_backoff_ms, multiplier, max_backoff_ms, max_attempts, max_age_ms FROM {t} WHERE queue_name = ?"
        )
        self._delete = session.prepare(f"DELETE FROM {t} WHERE queue_name = ?")
        self._written = session.prepare(f"SELECT WRITETIME(max_attempts) AS written FROM {t} WHERE queue_name = ?")

    async def set(self, queue: str, p: model.RetryPolicy) -> None:
        ms = lambda d: int(d / dt.timedelta(milliseconds=1))  # noqa: E731
        await execute(self._session, self._set, (
            queue, ms(p.initial_backoff), p.multiplier, ms(p.max_backoff), p.max_attempts, ms(p.max_age),
        ))

    async def delete(self, queue: str) -> None:
        await execute(self._session, self._delete, (queue,))

    async def written(self, queue: str) -> int:
        """When the queue's policy was last set (microseconds; its columns are written together);
        0 while it has none (the defaults)."""
        rows = await execute(self._session, self._written, (queue,))
        return rows[0].written or 0 if rows else 0

    async def get(self, queue: str) -> model.RetryPolicy:
        rows = await execute(self._session, self._get, (queue,))
        if not rows:
            return model.RetryPolicy()
        r = rows[0]
        return model.RetryPolicy(
            initial_backoff=dt.timedelta(milliseconds=r.initial_backoff_ms), multiplier=r.multiplier,
            max_backoff=dt.timedelta(milliseconds=r.max_backoff_ms), max_attempts=r.max_attempts,
            max_age=dt.timedelta(milliseconds=r.max_age_ms),
        )

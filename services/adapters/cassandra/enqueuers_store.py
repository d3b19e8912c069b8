"""``enqueuers_v1``: a lease per enqueue_svc process, a row rewritten with a TTL while the process
runs, so that it is gone within that TTL of the process's death (SIGKILL, OOM, a lost node). An
idempotency claim names its owner's lease (services/app/key_claims.py)."""

from __future__ import annotations

import uuid

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute


class EnqueuersStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.ENQUEUERS}"
        self._renew = session.prepare(f"INSERT INTO {t} (enqueuer, host) VALUES (?, ?) USING TTL ?")
        self._alive = session.prepare(f"SELECT enqueuer FROM {t} WHERE enqueuer = ?")

    async def renew(self, enqueuer: uuid.UUID, host: str, ttl_s: int) -> None:
        """Hold ``enqueuer``'s lease for ``ttl_s`` seconds from now (a plain write, no transaction)."""
        await execute(self._session, self._renew, (enqueuer, host, ttl_s))

    async def alive(self, enqueuer: uuid.UUID) -> bool:
        """Whether ``enqueuer``'s lease is held (read at the session's quorum: it sees the last renewal)."""
        return bool(await execute(self._session, self._alive, (enqueuer,)))

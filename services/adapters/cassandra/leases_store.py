"""``leases_v1``: a lease per background job, held by one replica at a time (lightweight
transactions; the row's TTL ends a lease its holder stopped renewing)."""

from __future__ import annotations

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute


class LeasesStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.LEASES}"
        self._take = session.prepare(f"INSERT INTO {t} (name, holder) VALUES (?, ?) IF NOT EXISTS USING TTL ?")
        self._renew = session.prepare(f"UPDATE {t} USING TTL ? SET holder = ? WHERE name = ? IF holder = ?")
        self._release = session.prepare(f"DELETE FROM {t} WHERE name = ? IF holder = ?")

    async def hold(self, name: str, holder: str, ttl_s: int) -> bool:
        """Take or renew the lease ``name`` for ``ttl_s``; False while another holder has it."""
        rows = await execute(self._session, self._take, (name, holder, ttl_s))
        if rows[0].applied or rows[0].holder == holder:
            if not rows[0].applied:
                renewed = await execute(self._session, self._renew, (ttl_s, holder, name, holder))
                return bool(renewed[0].applied)
            return True
        return False

    async def release(self, name: str, holder: str) -> None:
        """Give the lease ``name`` up, if ``holder`` still has it."""
        await execute(self._session, self._release, (name, holder))

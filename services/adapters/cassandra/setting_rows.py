"""The operators' settings in the ``traffic_shaping`` table (throttles, sites, rules, quotas): how
one is removed, and the version of one (what its change events are told apart by).

A setting's version is the write time of its row; a removed setting leaves a marker row
(``gone:<kind>``, same name, kept ``MARKER_TTL_S``) written with the delete in one batch of the
partition (atomic), so a setting removed and set again to the same value is a new version, and a
removal retried over the same state the same one (services/app/admin_events.py ``changed``).
The readers of the partition skip kinds they do not know, markers included."""

from __future__ import annotations

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.adapters.cassandra.statement_kinds import batch_kind

#: How long a removed setting's marker is kept: past it, a setting made again under the name may
#: repeat the id of the event that first set it, which no consumer still holds (twice the event
#: stream's default retention). Short, as every member reads the partition, markers and all, each
#: second: what a churn of settings leaves there is bounded by it.
MARKER_TTL_S = 14 * 24 * 3600


class SettingRows:
    def __init__(self, session: Session, keyspace: str, part: int) -> None:
        self._session = session
        self._part = part
        t = f"{keyspace}.{schema.SHAPING}"
        self._get = session.prepare(f"SELECT body FROM {t} WHERE part = ? AND kind = ? AND name = ?")
        self._delete = session.prepare(f"DELETE FROM {t} WHERE part = ? AND kind = ? AND name = ?")
        self._marker = session.prepare(f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, '{{}}') USING TTL ?")
        self._written = session.prepare(f"SELECT WRITETIME(body) AS written FROM {t} WHERE part = ? AND kind IN ? AND name = ?")

    async def remove(self, kind: str, name: str) -> bool:
        """Remove the setting, leaving its marker; whether it existed. Removing one that does not
        exist writes nothing: every member reads the partition, so a script clearing names that
        were never set would fill it with tombstones and markers."""
        if not await execute(self._session, self._get, (self._part, kind, name)):
            return False
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.add(self._delete, (self._part, kind, name))
        batch.add(self._marker, (self._part, f"gone:{kind}", name, MARKER_TTL_S))
        await execute(self._session, batch, kind=batch_kind(self._delete))
        return True

    async def version(self, kind: str, name: str) -> int:
        """The write time (microseconds) of the setting or of its removal, the later; 0 for a
        setting never set (or removed longer than MARKER_TTL_S ago)."""
        rows = await execute(self._session, self._written, (self._part, [kind, f"gone:{kind}"], name))
        return max((r.written or 0 for r in rows), default=0)

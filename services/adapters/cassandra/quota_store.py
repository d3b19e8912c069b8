"""Enqueue quotas in ``traffic_shaping`` (the QuotaStore, services/ports/quotas.py): partition
``PART`` of the shaping table, beside the shaping partition and read the same way, once per
member per REFRESH_S whatever the traffic (a handful of rows: the quotas and the members).
Members' heartbeats carry a TTL, so a killed replica disappears without anyone deleting it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.adapters.cassandra.setting_rows import SettingRows
from services.domain import quotas
from services.ports.quotas import QuotaSnapshot

#: The quotas' partition of traffic_shaping (0 is traffic shaping's).
PART = 1


def _body(q: quotas.Quota) -> str:
    return json.dumps({"mails_per_s": q.mails_per_s, "burst_mails": q.burst_mails, "bytes_per_s": q.bytes_per_s,
                       "burst_bytes": q.burst_bytes, "max_queued_mails": q.max_queued_mails,
                       "max_queued_bytes": q.max_queued_bytes,
                       "exempt_bounces": q.exempt_bounces, "exempt_senders": list(q.exempt_senders)})


def _quota(name: str, body: str) -> quotas.Quota:
    kind, _, subject = name.partition("|")
    b = json.loads(body)
    return quotas.Quota(kind, subject, b.get("mails_per_s"), int(b.get("burst_mails") or 1), b.get("bytes_per_s"),
                        int(b.get("burst_bytes") or 0), b.get("max_queued_mails"), b.get("max_queued_bytes"),
                        bool(b.get("exempt_bounces")), tuple(b.get("exempt_senders") or ()))


def _demand(body: str) -> dict[str, float]:
    """A heartbeat's demand (an older member's "{}" asks for nothing; so does an unreadable one)."""
    try:
        found: Any = json.loads(body or "{}").get("demand") or {}
        return {str(k): float(v) for k, v in found.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


class QuotaStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.SHAPING}"
        self._all = session.prepare(f"SELECT kind, name, body FROM {t} WHERE part = ?")
        self._put = session.prepare(f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, ?)")
        self._put_ttl = session.prepare(f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, ?) USING TTL ?")
        self._delete = session.prepare(f"DELETE FROM {t} WHERE part = ? AND kind = ? AND name = ?")
        self._settings = SettingRows(session, keyspace, PART)

    async def snapshot(self) -> QuotaSnapshot:
        rows = await execute_all(self._session, self._all, (PART,))
        found = tuple(_quota(r.name, r.body) for r in rows if r.kind == "quota")
        members = {r.name: _demand(r.body) for r in rows if r.kind == "member"}
        return QuotaSnapshot(found, tuple(sorted(members)), members)

    async def set_quota(self, q: quotas.Quota) -> None:
        await execute(self._session, self._put, (PART, "quota", f"{q.kind}|{q.subject}", _body(q)))

    async def clear_quota(self, kind: str, subject: str) -> bool:
        return await self._settings.remove("quota", f"{kind}|{subject}")

    async def version(self, kind: str, subject: str) -> int:
        return await self._settings.version("quota", f"{kind}|{subject}")

    async def heartbeat(self, member: str, ttl_s: int, demand: Mapping[str, float] | None = None) -> None:
        body = json.dumps({"demand": {k: round(v, 3) for k, v in (demand or {}).items()}})
        await execute(self._session, self._put_ttl, (PART, "member", member, body, ttl_s))

    async def leave(self, member: str) -> None:
        await execute(self._session, self._delete, (PART, "member", member))

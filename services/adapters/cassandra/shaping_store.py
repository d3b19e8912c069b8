"""``traffic_shaping`` and ``shaping_failures``: the ShapingStore (services/ports/shaping.py).

One partition holds everything a dequeue member reads each second (a handful of rows: one read
per member per second, whatever the traffic). Effects and heartbeats carry a TTL, so a lifted
effect and a killed member disappear without anyone deleting them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from cassandra.cluster import Session
from cassandra.util import max_uuid_from_time, min_uuid_from_time, uuid_from_time

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.adapters.cassandra.setting_rows import SettingRows
from services.domain import shaping

PART = 0


def _rate(r: shaping.Rate | None) -> list[Any] | None:
    return [r.count, r.per] if r is not None else None


def _from_rate(v: Any) -> shaping.Rate | None:
    return shaping.Rate(int(v[0]), str(v[1])) if v else None


def _ts(at: dt.datetime) -> float:
    return at.timestamp()


def _at(v: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(v, dt.timezone.utc)


class ShapingStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.SHAPING}"
        f = f"{keyspace}.{schema.SHAPING_FAILURES}"
        self._all = session.prepare(f"SELECT kind, name, body FROM {t} WHERE part = ?")
        self._put = session.prepare(f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, ?)")
        self._put_ttl = session.prepare(f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, ?) USING TTL ?")
        self._put_new = session.prepare(
            f"INSERT INTO {t} (part, kind, name, body) VALUES (?, ?, ?, ?) IF NOT EXISTS USING TTL ?")
        self._get = session.prepare(f"SELECT body FROM {t} WHERE part = ? AND kind = ? AND name = ?")
        self._delete = session.prepare(f"DELETE FROM {t} WHERE part = ? AND kind = ? AND name = ?")
        self._fail = session.prepare(f"INSERT INTO {f} (destination, rule_id, at) VALUES (?, ?, ?) USING TTL ?")
        self._count = session.prepare(f"SELECT count(*) FROM {f} WHERE destination = ? AND rule_id = ? AND at > ? AND at <= ?")
        self._settings = SettingRows(session, keyspace, PART)

    async def snapshot(self) -> shaping.Snapshot:
        rows = await execute_all(self._session, self._all, (PART,))
        throttles, sites, rules, effects, members = [], [], [], [], {}
        for r in rows:
            b = json.loads(r.body)
            if r.kind == "throttle":
                throttles.append(shaping.Throttle(b["destination"], b["queue"], _from_rate(b.get("rate")), b.get("concurrency")))
            elif r.kind == "site":
                sites.append(shaping.Site(r.name, tuple(b["domains"])))
            elif r.kind == "rule":
                rules.append(shaping.AutoRule(r.name, b["pattern"], b["threshold"], dt.timedelta(seconds=b["window_s"]),
                                              b["action"], dt.timedelta(seconds=b["duration_s"]), _from_rate(b.get("floor"))))
            elif r.kind == "effect":
                effects.append(shaping.Effect(r.name, b["rule_id"], b["action"], _at(b["started_at"]), _at(b["ends_at"]),
                                              _from_rate(b.get("floor"))))
            elif r.kind == "member":
                members[r.name] = b
        return shaping.Snapshot(tuple(throttles), tuple(sites), tuple(rules), tuple(effects), members)

    async def _exists(self, kind: str, name: str) -> bool:
        return bool(await execute(self._session, self._get, (PART, kind, name)))

    async def _remove(self, kind: str, name: str) -> bool:
        if kind == "effect":  # an effect's events name it by when it started
            existed = await self._exists(kind, name)
            await execute(self._session, self._delete, (PART, kind, name))
            return existed
        return await self._settings.remove(kind, name)

    async def version(self, what: str, name: str, queue: str = "") -> int:
        kind = {"throttle": "throttle", "site": "site", "auto_rule": "rule", "effect": "effect"}[what]
        return await self._settings.version(kind, f"{queue}|{name}" if kind == "throttle" else name)

    async def set_throttle(self, t: shaping.Throttle) -> None:
        body = {"destination": t.destination, "queue": t.queue, "rate": _rate(t.rate), "concurrency": t.concurrency}
        await execute(self._session, self._put, (PART, "throttle", f"{t.queue}|{t.destination}", json.dumps(body)))

    async def clear_throttle(self, queue: str, destination: str) -> bool:
        return await self._remove("throttle", f"{queue}|{destination}")

    async def set_site(self, s: shaping.Site) -> None:
        await execute(self._session, self._put, (PART, "site", s.name, json.dumps({"domains": list(s.domains)})))

    async def delete_site(self, name: str) -> bool:
        return await self._remove("site", name)

    async def set_rule(self, r: shaping.AutoRule) -> None:
        body = {"pattern": r.pattern, "threshold": r.threshold, "window_s": r.window.total_seconds(), "action": r.action,
                "duration_s": r.duration.total_seconds(), "floor": _rate(r.floor)}
        await execute(self._session, self._put, (PART, "rule", r.rule_id, json.dumps(body)))

    async def delete_rule(self, rule_id: str) -> bool:
        return await self._remove("rule", rule_id)

    async def put_effect(self, e: shaping.Effect) -> bool:
        """False when an effect is already in force on the destination (a lightweight transaction:
        replicas that reach a threshold together fire it once)."""
        ttl = max(1, math.ceil((e.ends_at - dt.datetime.now(dt.timezone.utc)).total_seconds()))
        body = {"rule_id": e.rule_id, "action": e.action, "started_at": _ts(e.started_at), "ends_at": _ts(e.ends_at),
                "floor": _rate(e.floor)}
        rows = await execute(self._session, self._put_new, (PART, "effect", e.destination, json.dumps(body), ttl))
        return bool(rows and rows[0][0])

    async def lift_effect(self, destination: str) -> bool:
        return await self._remove("effect", destination)

    async def heartbeat(self, member: str, stats: dict[str, dict[str, float]]) -> None:
        await execute(self._session, self._put_ttl, (PART, "member", member, json.dumps(stats), shaping.MEMBER_TTL_S))

    async def leave(self, member: str) -> None:
        await execute(self._session, self._delete, (PART, "member", member))

    async def count_failure(self, destination: str, rule_id: str, at: dt.datetime, window: dt.timedelta) -> int:
        ttl = max(1, math.ceil(window.total_seconds()))
        await execute(self._session, self._fail, (destination, rule_id, uuid_from_time(at), ttl))
        rows = await execute(self._session, self._count, (
            destination, rule_id, min_uuid_from_time(_ts(at - window)), max_uuid_from_time(_ts(at))))
        return int(rows[0].count) if rows else 0

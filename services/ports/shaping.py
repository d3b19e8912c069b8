"""What traffic shaping needs from storage (services/adapters/cassandra/shaping_store.py): the
operators' throttles, sites and automatic rules, the effects in force, the consuming dequeue
members' heartbeats, and the failures counted towards a rule's threshold."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from services.domain import shaping


class ShapingStore(Protocol):
    async def snapshot(self) -> shaping.Snapshot:
        """Everything in force, in one read (each member reads it every REFRESH_S)."""

    async def set_throttle(self, t: shaping.Throttle) -> None: ...
    async def clear_throttle(self, queue: str, destination: str) -> bool: ...
    async def set_site(self, s: shaping.Site) -> None: ...
    async def delete_site(self, name: str) -> bool: ...
    async def set_rule(self, r: shaping.AutoRule) -> None: ...
    async def delete_rule(self, rule_id: str) -> bool: ...

    async def put_effect(self, e: shaping.Effect) -> bool:
        """In force until ``e.ends_at`` (then gone by itself); False (nothing written) when an
        effect is in force on the destination already."""

    async def lift_effect(self, destination: str) -> bool: ...

    async def version(self, what: str, name: str, queue: str = "") -> int:
        """The version of a setting (``what``: throttle, site, auto_rule, effect): when it was last
        set or removed (microseconds), 0 if never. Its change events are told apart by it."""

    async def heartbeat(self, member: str, stats: dict[str, dict[str, float]]) -> None:
        """The member consumes; it is one until MEMBER_TTL_S after its last heartbeat."""

    async def leave(self, member: str) -> None: ...

    async def count_failure(self, destination: str, rule_id: str, at: dt.datetime, window: dt.timedelta) -> int:
        """Record one matching failure; how many were recorded within ``window`` up to ``at``."""

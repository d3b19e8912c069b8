"""What enqueue quotas need from storage (services/adapters/cassandra/quota_store.py): the
operators' quotas and the live enqueue members' heartbeats, read together in one call."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from services.domain import quotas


@dataclasses.dataclass(frozen=True)
class QuotaSnapshot:
    quotas: tuple[quotas.Quota, ...] = ()
    #: The enqueue members whose heartbeat is live (they split the rates among them).
    members: tuple[str, ...] = ()
    #: What each member was asked for at its last heartbeat: member -> {demand key -> per second}
    #: (services/app/quota_keeper.py ``demand_key``); a member that said nothing asks for nothing.
    demand: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)


class QuotaStore(Protocol):
    async def snapshot(self) -> QuotaSnapshot:
        """Every quota and live member, in one read (each enqueue member reads it every REFRESH_S)."""

    async def set_quota(self, q: quotas.Quota) -> None: ...

    async def clear_quota(self, kind: str, subject: str) -> bool:
        """True when the quota existed."""

    async def version(self, kind: str, subject: str) -> int:
        """When the quota was last set or cleared (microseconds), 0 if never: its change events
        are told apart by it."""

    async def heartbeat(self, member: str, ttl_s: int, demand: Mapping[str, float] | None = None) -> None:
        """``member`` enqueues; it is one until ``ttl_s`` after its last heartbeat. ``demand``:
        the mails and bytes a second it was asked for since the last one, by demand key."""

    async def leave(self, member: str) -> None: ...

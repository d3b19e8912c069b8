"""What enqueue quotas need from storage (services/adapters/cassandra/quota_store.py): the
operators' quotas and the live enqueue members' heartbeats, read together in one call."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from services.domain import quotas


@dataclasses.dataclass(frozen=True)
class QuotaSnapshot:
    quotas: tuple[quotas.Quota, ...] = ()
    #: The enqueue members whose heartbeat is live (each splits the rates by their number).
    members: tuple[str, ...] = ()


class QuotaStore(Protocol):
    async def snapshot(self) -> QuotaSnapshot:
        """Every quota and live member, in one read (each enqueue member reads it every REFRESH_S)."""

    async def set_quota(self, q: quotas.Quota) -> None: ...

    async def clear_quota(self, kind: str, subject: str) -> bool:
        """True when the quota existed."""

    async def heartbeat(self, member: str, ttl_s: int) -> None:
        """``member`` enqueues; it is one until ``ttl_s`` after its last heartbeat."""

    async def leave(self, member: str) -> None: ...

"""The operators' side of enqueue quotas (stored with services/ports/quotas.py; every enqueue
member reads them within REFRESH_S: services/app/quota_keeper.py).

Every change is recorded QUOTA_CHANGED (details: "quota" as kind:subject, "change" set or removed, and
the limits changed) before it is stored; setting what is set already, or clearing what does not
exist, records nothing (services/app/admin_events.py)."""

from __future__ import annotations

import dataclasses

from services.app import admin_events
from services.app.queue_state import QueueState
from services.domain import quotas
from services.domain.events import EventType
from services.ports.events import EventLog
from services.ports.quotas import QuotaStore


class QuotaAdmin:
    def __init__(self, store: QuotaStore, state: QueueState, events: EventLog | None = None) -> None:
        self._store = store
        self._state = state
        self._events = events

    async def set_quota(self, q: quotas.Quota) -> quotas.Quota:
        """``q`` validated by the caller (quotas.validate); a queue's quota needs the queue to exist."""
        if q.kind == "queue":
            await self._state.require_queue(q.subject)
        before = await self._find(q.kind, q.subject)
        await self._record(q.kind, q.subject, before, q)
        await self._store.set_quota(q)
        return q

    async def clear_quota(self, kind: str, subject: str) -> bool:
        subject = quotas.subject_name(kind, subject)
        before = await self._find(kind, subject)
        await self._record(kind, subject, before, None)
        return await self._store.clear_quota(kind, subject)

    async def listing(self, kind: str = "") -> tuple[list[quotas.Quota], int]:
        """The quotas (of ``kind``, or all), by kind then subject; and the live enqueue members."""
        snap = await self._store.snapshot()
        found = sorted((q for q in snap.quotas if not kind or q.kind == kind), key=lambda q: (quotas.KINDS.index(q.kind), q.subject))
        return found, len(snap.members)

    async def _find(self, kind: str, subject: str) -> quotas.Quota | None:
        return next((q for q in (await self._store.snapshot()).quotas if q.key == (kind, subject)), None)

    async def _record(self, kind: str, subject: str, before: quotas.Quota | None, after: quotas.Quota | None) -> None:
        event = admin_events.changed(EventType.QUOTA_CHANGED, subject if kind == "queue" else "", _settings(before),
                                     _settings(after), version=str(await self._store.version(kind, subject)), quota=f"{kind}:{subject}",
                                     change="set" if after is not None else "removed")
        if event is not None:
            await admin_events.record(self._events, [event])


def _settings(q: quotas.Quota | None) -> dict[str, str]:
    """A quota's limits as strings (none: {})."""
    if q is None:
        return {}
    return {f.name: str(getattr(q, f.name)) for f in dataclasses.fields(q) if f.name not in ("kind", "subject")}

"""The operators' side of webhooks: register, list and remove the endpoints webhook_svc delivers to
(stored with services/ports/webhooks.py ``Registry``; webhook_svc reads them every
MAILQUEUE_WEBHOOK_RELOAD_S).

Each change is recorded CONFIG_CHANGED (queue "", details: ``what`` webhook, ``webhook`` its name,
``change`` added or removed, and its settings, never a secret) before it is stored, as every
change without a journal is (services/app/admin_events.py). A refused call (bad input, a name
used twice, an unknown name) is refused before anything is recorded or written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from services.app import admin_events
from services.domain import model, webhook_registry
from services.domain.errors import AlreadyExists, NotFound
from services.domain.events import EventType
from services.domain.webhook_registry import Registration
from services.ports.events import EventLog
from services.ports.webhooks import Registry


class WebhookAdmin:
    def __init__(self, registry: Registry, events: EventLog | None = None) -> None:
        self._registry = registry
        self._events = events

    async def add(self, r: Registration) -> Registration:
        """Register ``r``: InvalidArgument (webhook_registry.validate), AlreadyExists when its name is taken."""
        now = model.utcnow()  # to the millisecond, as stored: the version of its events
        r = dataclasses.replace(webhook_registry.validate(r), created_at=now.replace(microsecond=now.microsecond // 1000 * 1000))
        if await self._registry.get(r.name) is not None:
            raise AlreadyExists(f"a webhook named {r.name!r} exists: remove it first (mailq webhook remove {r.name}) or pick another name")
        if not await self._registry.add(r):  # registered meanwhile by another call: it records its own
            raise AlreadyExists(f"a webhook named {r.name!r} exists: remove it first or pick another name")
        try:  # recorded once the name is ours (insert-if-absent), so a refused call records nothing
            await self._record(r.name, "added", {}, r.settings(), r.created_at)
        except BaseException:
            await self._registry.remove(r.name)  # unrecorded, it is not registered either
            raise
        return r

    async def remove(self, name: str) -> Registration:
        """Unregister ``name`` (its checkpoint stays); NotFound when none has that name."""
        webhook_registry.name_of(name)
        before = await self._registry.get(name)
        if before is None:
            raise NotFound(f"no webhook named {name!r} (mailq webhook list shows them)")
        await self._record(name, "removed", before.settings(), {}, before.created_at)
        if await self._registry.remove(name) is None:
            raise NotFound(f"no webhook named {name!r} (removed meanwhile)")
        return before

    async def list(self) -> list[Registration]:
        return await self._registry.all()

    async def _record(self, name: str, change: str, before: dict[str, str], after: dict[str, str],
                      registered_at: dt.datetime | None) -> None:
        """``registered_at``: the registration's time, the version of its events (a webhook added,
        removed and added again is two additions)."""
        version = registered_at.isoformat() if registered_at is not None else ""
        event = admin_events.changed(EventType.CONFIG_CHANGED, "", before, after, version=version, what="webhook",
                                     webhook=name, change=change)
        if event is not None:
            await admin_events.record(self._events, [event])

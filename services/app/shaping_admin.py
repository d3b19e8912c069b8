"""The operators' side of traffic shaping: throttles, sites, automatic rules and effects
(stored with services/ports/shaping.py; every dequeue member reads them within REFRESH_S).

Every change is recorded SHAPING_CHANGED (details: "destination", "change" set or removed,
"what" it is, and the settings changed) before it is stored; setting what is already set, or
removing what does not exist, records nothing (services/app/admin_events.py)."""

from __future__ import annotations

import dataclasses

from services.app import admin_events
from services.app.queue_state import QueueState
from services.domain import model, shaping
from services.domain.errors import FailedPrecondition
from services.domain.events import EventType
from services.domain.validation import queue_name
from services.ports.events import EventLog
from services.ports.shaping import ShapingStore


@dataclasses.dataclass(frozen=True)
class Listing:
    throttles: list[shaping.Throttle]
    sites: list[shaping.Site]
    rules: list[shaping.AutoRule]
    #: Each effect in force with its rate now (SLOW) or None.
    effects: list[tuple[shaping.Effect, shaping.Rate | None]]
    destinations: list[shaping.DestinationStatus]
    members: int


class ShapingAdmin:
    def __init__(self, store: ShapingStore, state: QueueState, events: EventLog | None = None) -> None:
        self._store = store
        self._state = state
        self._events = events

    async def set_throttle(self, t: shaping.Throttle) -> shaping.Throttle:
        """``t`` validated by the caller (shaping.validate_throttle); its queue must exist."""
        if t.queue:
            await self._state.require_queue(t.queue)
        before = next((x for x in (await self._store.snapshot()).throttles if x.key == t.key), None)
        await self._record("throttle", t.destination, t.queue, before, t)
        await self._store.set_throttle(t)
        return t

    async def clear_throttle(self, queue: str, destination: str) -> bool:
        if queue:
            queue_name(queue)
        destination = shaping.destination_name(destination)
        before = next((x for x in (await self._store.snapshot()).throttles if x.key == (queue, destination)), None)
        await self._record("throttle", destination, queue, before, None)
        return await self._store.clear_throttle(queue, destination)

    async def set_site(self, s: shaping.Site) -> shaping.Site:
        sites = (await self._store.snapshot()).sites
        taken = {d: x.name for x in sites if x.name != s.name for d in x.domains if d in s.domains}
        if taken:  # a domain of two sites would go to one of them by the order of their names
            d, other = min(taken.items())
            raise FailedPrecondition(f"domain {d} belongs to site {other}: remove it there first "
                                     f"(SetSite {other} without it, or DeleteSite {other}); nothing was changed")
        before = next((x for x in sites if x.name == s.name), None)
        await self._record("site", s.name, "", before, s)
        await self._store.set_site(s)
        return s

    async def delete_site(self, name: str) -> bool:
        name = shaping.destination_name(name, "site name")
        await self._record("site", name, "", next((x for x in (await self._store.snapshot()).sites if x.name == name), None), None)
        return await self._store.delete_site(name)

    async def set_rule(self, r: shaping.AutoRule) -> shaping.AutoRule:
        before = next((x for x in (await self._store.snapshot()).rules if x.rule_id == r.rule_id), None)
        await self._record("auto_rule", r.rule_id, "", before, r)
        await self._store.set_rule(r)
        return r

    async def delete_rule(self, rule_id: str) -> bool:
        rule_id = shaping.destination_name(rule_id, "rule_id")
        before = next((x for x in (await self._store.snapshot()).rules if x.rule_id == rule_id), None)
        await self._record("auto_rule", rule_id, "", before, None)
        return await self._store.delete_rule(rule_id)

    async def lift_effect(self, destination: str) -> bool:
        destination = shaping.destination_name(destination)
        before = next((x for x in (await self._store.snapshot()).effects if x.destination == destination), None)
        await self._record("effect", destination, "", before, None)
        return await self._store.lift_effect(destination)

    async def _record(self, what: str, name: str, queue: str, before: object | None, after: object | None) -> None:
        version = await self._store.version(what, name, queue)
        event = admin_events.changed(EventType.SHAPING_CHANGED, queue, _settings(before), _settings(after), version=str(version),
                                     destination=name, change="set" if after is not None else "removed", what=what)
        if event is not None:
            await admin_events.record(self._events, [event])

    async def throttles(self, queue: str) -> list[shaping.Throttle]:
        """The throttles ``queue``'s mails are held to."""
        return shaping.applying_to((await self._store.snapshot()).throttles, queue)

    async def listing(self, queue: str = "") -> Listing:
        if queue:
            await self._state.require_queue(queue_name(queue))
        snap = await self._store.snapshot()
        throttles = shaping.applying_to(snap.throttles, queue) if queue else sorted(
            snap.throttles, key=lambda t: (t.destination, t.queue))
        now = model.utcnow()
        effects = []
        for e in sorted(snap.effects, key=lambda e: e.destination):
            rated = [t.rate for t in snap.throttles if t.destination == e.destination and t.rate is not None]
            base = min(rated, key=lambda r: r.per_second) if rated else None
            effects.append((e, shaping.effect_rate(e, base, now)))
        return Listing(throttles, sorted(snap.sites, key=lambda s: s.name), sorted(snap.rules, key=lambda r: r.rule_id),
                       effects, shaping.status(snap.members), len(snap.members))


def _settings(item: object | None) -> dict[str, str]:
    """A throttle's, site's, rule's or effect's fields as strings (none: {})."""
    if item is None:
        return {}
    return {f.name: str(getattr(item, f.name)) for f in dataclasses.fields(item)}  # type: ignore[arg-type]

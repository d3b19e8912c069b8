"""The operators' side of traffic shaping: throttles, sites, automatic rules and effects
(stored with services/ports/shaping.py; every dequeue member reads them within REFRESH_S)."""

from __future__ import annotations

import dataclasses

from services.app.queue_state import QueueState
from services.domain import model, shaping
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
    def __init__(self, store: ShapingStore, state: QueueState) -> None:
        self._store = store
        self._state = state

    async def set_throttle(self, t: shaping.Throttle) -> shaping.Throttle:
        """``t`` validated by the caller (shaping.validate_throttle); its queue must exist."""
        if t.queue:
            await self._state.require_queue(t.queue)
        await self._store.set_throttle(t)
        return t

    async def clear_throttle(self, queue: str, destination: str) -> bool:
        return await self._store.clear_throttle(queue, shaping.destination_name(destination))

    async def set_site(self, s: shaping.Site) -> shaping.Site:
        await self._store.set_site(s)
        return s

    async def delete_site(self, name: str) -> bool:
        return await self._store.delete_site(shaping.destination_name(name, "site name"))

    async def set_rule(self, r: shaping.AutoRule) -> shaping.AutoRule:
        await self._store.set_rule(r)
        return r

    async def delete_rule(self, rule_id: str) -> bool:
        return await self._store.delete_rule(shaping.destination_name(rule_id, "rule_id"))

    async def lift_effect(self, destination: str) -> bool:
        return await self._store.lift_effect(shaping.destination_name(destination))

    async def throttles(self, queue: str) -> list[shaping.Throttle]:
        """The throttles ``queue``'s mails are held to."""
        return shaping.applying_to((await self._store.snapshot()).throttles, queue)

    async def listing(self, queue: str = "") -> Listing:
        if queue:
            await self._state.require_queue(queue)
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

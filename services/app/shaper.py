"""Traffic shaping in one dequeue process (the rules: services/domain/shaping.py).

Shared, not per process, at no backend call per mail: the limits are **split** among the dequeue
processes that consume (the members). Each member writes a heartbeat (TTL ``MEMBER_TTL_S``) and
reads the shaping partition every ``REFRESH_S``: the throttles, sites, rules, effects and the
members. With N members, each one hands out ``rate / N`` (its own grid of slots) and its part of
the concurrency (the parts add up to the limit). A member killed stops heartbeating: within
``MEMBER_TTL_S`` the others take its share, and its unanswered deliveries come back from the
broker. A new member takes a share only ``JOIN_AFTER_S`` after its heartbeat is visible (every
other member has re-split by then), so the parts never add up to more than the limit.

Over-limit mail is not handed out and not spun: it reserves the next slot of its destination's
grid and waits for it in the delay ladder (one publish and one ack, no Cassandra write, no
attempt or delivery count spent), carrying its reservation; arriving at its slot it is handed
out without reserving again, unless the members or the rate changed meanwhile (its stamp no
longer matches: it reserves again on the new grid). Mails keep their order within a destination
(slots are reserved in arrival order). Concurrency: a mail that finds its destination's part
full waits for a slot paced by the answer time seen so far. Mails of other destinations are not
held back: a waiting mail leaves the consumer's prefetch at once (no head-of-line blocking).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import heapq
import logging
import time
import uuid

from prometheus_client import Counter, Gauge, Histogram

from services.domain import delays, model, shaping
from services.domain.errors import BackendUnavailable
from services.ports.shaping import ShapingStore

log = logging.getLogger(__name__)

IN_FLIGHT = Gauge("mailqueue_shaping_in_flight", "Deliveries handed out and unanswered, per shaped destination (this process)",
                  ["destination"])
HANDED_OUT = Counter("mailqueue_shaping_delivered_total", "Deliveries handed out to shaped destinations", ["destination"])
WAITS = Counter("mailqueue_shaping_waits_total", "Mails sent to wait for room at their destination", ["destination", "reason"])
WAITING = Gauge("mailqueue_shaping_waiting", "Mails this process sent to wait whose slot has not come yet", ["destination"])
FIRED = Counter("mailqueue_shaping_rule_fired_total", "Automatic shaping rules fired", ["destination", "rule", "action"])
MEMBERS = Gauge("mailqueue_shaping_members", "Dequeue processes sharing the limits, as this process last read them")
LATENESS = Histogram("mailqueue_shaping_slot_lateness_seconds", "How long after its reserved slot a waiting mail was handed out",
                     ["destination"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))

#: A reservation is honoured this long after its slot (the ladder rounds up; a busy broker is late).
HONOUR_S = 5.0
#: A slot this close ahead is handed out now.
EARLY_S = 0.01
#: The longest single wait: a slot further ahead is waited for in parts, keeping its reservation.
MAX_WAIT = delays.MAX_DELAY
#: A member not yet sharing (joining) sends its mails of limited destinations to wait this long.
JOIN_WAIT = dt.timedelta(seconds=1)
#: A member whose last subscription closed stays one this long (a consumer that reconnects does
#: not join again, which costs JOIN_AFTER_S of waiting).
LINGER_S = 30.0
#: The answer time assumed for a destination until one is seen (paces its concurrency waits).
DEFAULT_LATENCY_S = 0.1
#: Stats window for the delivered rate in heartbeats.
RATE_WINDOW_S = 10.0


@dataclasses.dataclass(frozen=True)
class Ticket:
    """Room taken in the concurrency of ``keys`` (given back by ``release``)."""

    keys: tuple[tuple[str, str], ...]
    destinations: tuple[str, ...]
    taken_at: float


@dataclasses.dataclass(frozen=True)
class Wait:
    delay: dt.timedelta
    reason: str  # suspended, rate, concurrency, joining
    destinations: tuple[str, ...]
    #: (slot ms, stamp): carried by the waiting message (rate waits only).
    reservation: tuple[int, int] | None = None


@dataclasses.dataclass
class _Limit:
    key: tuple[str, str]
    destination: str
    rate_per_s: float | None
    concurrency: int | None


class Shaper:
    def __init__(self, store: ShapingStore, member: str | None = None) -> None:
        self._store = store
        self.member = member or uuid.uuid4().hex
        self.snapshot = shaping.Snapshot()
        self._sites: dict[str, str] = {}
        self._throttles: dict[str, list[shaping.Throttle]] = {}
        #: True when any throttle or effect exists: otherwise admit() costs one attribute read.
        self.active = False
        self._consumers = 0
        self._last_consumer_left = -1e9
        self._seen_since: float | None = None  # when this member's heartbeat was first read back
        self._grids: dict[tuple[str, tuple[str, str]], tuple[int, shaping.Grid]] = {}
        self.in_flight: collections.Counter[tuple[str, str]] = collections.Counter()
        self._dest_in_flight: collections.Counter[str] = collections.Counter()
        self._latency: dict[tuple[str, str], float] = {}
        self._handed: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._waiting: dict[str, list[float]] = collections.defaultdict(list)
        self._fired: dict[tuple[str, str], dt.datetime] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- membership and refresh -----------------------------------------------------------

    def consuming(self, delta: int) -> None:
        """A subscription opened (+1) or closed (-1) in this process."""
        before, self._consumers = self._consumers, self._consumers + delta
        if before == 0 and self._consumers > 0 and not self._member():
            self._spawn(self._heartbeat())
        elif before > 0 and self._consumers == 0:
            self._last_consumer_left = time.monotonic()

    def _member(self) -> bool:
        """Consuming, or did within LINGER_S."""
        return self._consumers > 0 or time.monotonic() - self._last_consumer_left < LINGER_S

    async def run_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except BackendUnavailable as e:
                log.warning("shaping state not refreshed: %s", e)
            except Exception:  # a bug must not stop shaping for the life of the process
                log.exception("shaping state not refreshed")
            await asyncio.sleep(shaping.REFRESH_S)

    async def refresh(self) -> None:
        if self._member():
            await self._heartbeat()
        elif self.member in self.snapshot.members:
            await self._store.leave(self.member)
        self.apply(await self._store.snapshot())

    async def _heartbeat(self) -> None:
        await self._store.heartbeat(self.member, self.stats())

    def apply(self, snap: shaping.Snapshot) -> None:
        before = {(e.destination, e.action) for e in self.snapshot.effects}
        after = {(e.destination, e.action) for e in snap.effects}
        for destination, action in sorted(before - after):
            log.info("shaping effect ended", extra={"destination": destination, "action": action})
        self.snapshot = snap
        self._sites = shaping.site_of(snap.sites)
        self._throttles = collections.defaultdict(list)
        for t in snap.throttles:
            self._throttles[t.destination].append(t)
        self.active = bool(snap.throttles or snap.effects)
        if self.member in snap.members and self._member():
            self._seen_since = self._seen_since or time.monotonic()
        else:
            self._seen_since = None
        MEMBERS.set(len(snap.members))
        now = time.time()
        for dest, slots in self._waiting.items():
            while slots and slots[0] <= now:
                heapq.heappop(slots)
            WAITING.labels(dest).set(len(slots))

    def _share(self) -> tuple[int, int] | None:
        """(my index, members) once this member shares the limits; None while joining."""
        if self._seen_since is None or time.monotonic() - self._seen_since < shaping.JOIN_AFTER_S:
            return None
        return shaping.member_index(self.snapshot.members, self.member)

    # --- admission --------------------------------------------------------------------------

    def _limits(self, queue: str, dests: tuple[str, ...], now: dt.datetime) -> list[_Limit]:
        found = []
        for dest in dests:
            throttles = [t for t in self._throttles.get(dest, ()) if t.queue in ("", queue)]
            for t in throttles:
                found.append(_Limit(t.key, dest, t.rate.per_second if t.rate else None, t.concurrency))
            rated = [t.rate for t in throttles if t.rate is not None]
            base = min(rated, key=lambda r: r.per_second) if rated else None
            for e in self.snapshot.effects:
                if e.destination == dest:
                    slowed = shaping.effect_rate(e, base, now)
                    if slowed is not None:
                        found.append(_Limit(("~slow", dest), dest, slowed.per_second, None))
        return found

    def admit(self, queue: str, mail: model.QueuedMail, reservation: tuple[int, int] | None,
              now: dt.datetime) -> Ticket | Wait | None:
        """None: no limit applies (hand it out). A Ticket: hand it out and ``release`` it when
        answered. A Wait: not now; publish it again with the wait's delay and reservation."""
        if not self.active:
            return None
        dests = shaping.destinations(mail.mail.recipients, self._sites)
        until = shaping.suspended_until(self.snapshot.effects, dests, now)
        if until is not None:
            return self._wait(until - now, "suspended", dests)
        limits = self._limits(queue, dests, now)
        if not limits:
            return None
        share = self._share()
        if share is None:
            return self._wait(JOIN_WAIT, "joining", dests)
        index, count = share
        t = now.timestamp()
        for lim in limits:
            if lim.concurrency is not None and self.in_flight[lim.key] >= shaping.concurrency_share(lim.concurrency, index, count):
                return self._wait(self._concurrency_wait(lim, index, count, t), "concurrency", dests)
        rated = [(lim.key, lim.rate_per_s) for lim in limits if lim.rate_per_s]
        if rated:
            st = shaping.stamp(self.snapshot.members, rated)
            mine = reservation is not None and reservation[1] == st
            if mine and reservation[0] / 1000 > t + EARLY_S:  # back before its slot: a wait taken in parts
                return self._wait(dt.timedelta(seconds=reservation[0] / 1000 - t), "rate", dests, reservation)
            if mine and t - HONOUR_S <= reservation[0] / 1000:
                for dest in dests:
                    LATENESS.labels(dest).observe(t - reservation[0] / 1000)
            else:
                slot = max(self._grid("rate", key, count / rate).reserve(t) for key, rate in rated)
                if slot > t + EARLY_S:
                    return self._wait(dt.timedelta(seconds=slot - t), "rate", dests, (int(slot * 1000), st))
        keys = tuple(lim.key for lim in limits if lim.concurrency is not None)
        for key in keys:
            self.in_flight[key] += 1
        for dest in dests:
            self._dest_in_flight[dest] += 1
            IN_FLIGHT.labels(dest).set(self._dest_in_flight[dest])
            HANDED_OUT.labels(dest).inc()
            self._handed[dest].append(t)
        return Ticket(keys, dests, time.monotonic())

    def _grid(self, kind: str, key: tuple[str, str], spacing: float) -> shaping.Grid:
        """The grid of ``key`` at ``spacing``; a new one (from now) when the spacing changed."""
        st = shaping.stamp(self.snapshot.members, [(key, spacing)])
        found = self._grids.get((kind, key))
        if found is None or found[0] != st:
            found = (st, shaping.Grid(spacing))
            self._grids[(kind, key)] = found
        return found[1]

    def _concurrency_wait(self, lim: _Limit, index: int, count: int, now: float) -> dt.timedelta:
        """A slot paced by the answer time: my part frees one place every latency / part."""
        assert lim.concurrency is not None
        part = max(shaping.concurrency_share(lim.concurrency, index, count), 1)
        spacing = max(self._latency.get(lim.key, DEFAULT_LATENCY_S), 0.01) / part
        slot = self._grid("concurrency", lim.key, round(spacing, 2)).reserve(now)
        return max(dt.timedelta(seconds=slot - now), delays.UNIT)

    def _wait(self, delay: dt.timedelta, reason: str, dests: tuple[str, ...],
              reservation: tuple[int, int] | None = None) -> Wait:
        delay = min(delay, MAX_WAIT)
        end = time.time() + delay.total_seconds()
        for dest in dests:
            WAITS.labels(dest, reason).inc()
            heapq.heappush(self._waiting[dest], end)
        return Wait(delay, reason, dests, reservation)

    def release(self, ticket: Ticket | None, handed_out: bool = True) -> None:
        """The delivery was answered or returned (or, ``handed_out`` False, the mail turned out
        not to be delivered): its room is free again."""
        if ticket is None:
            return
        took = time.monotonic() - ticket.taken_at
        for key in ticket.keys:
            self.in_flight[key] -= 1
            if not handed_out:
                continue
            previous = self._latency.get(key)
            self._latency[key] = took if previous is None else 0.8 * previous + 0.2 * took
        for dest in ticket.destinations:
            self._dest_in_flight[dest] -= 1
            IN_FLIGHT.labels(dest).set(self._dest_in_flight[dest])

    def stats(self) -> dict[str, dict[str, float]]:
        """Per destination: in flight, handed out per second (last RATE_WINDOW_S), waiting."""
        now = time.time()
        out: dict[str, dict[str, float]] = {}
        for dest in set(self._handed) | set(self._waiting) | set(self._dest_in_flight):
            handed = self._handed.get(dest)
            while handed and handed[0] < now - RATE_WINDOW_S:
                handed.popleft()
            waiting = sum(1 for end in self._waiting.get(dest, ()) if end > now)
            entry = {"in_flight": self._dest_in_flight.get(dest, 0), "delivered_per_s": len(handed or ()) / RATE_WINDOW_S,
                     "waiting": waiting}
            if any(entry.values()):
                out[dest] = entry
        return out

    # --- automatic rules --------------------------------------------------------------------

    def observe_retry(self, mail: model.QueuedMail, error: str) -> None:
        """A consumer answered RETRY: count it towards the automatic rules its error matches."""
        rules = [r for r in self.snapshot.rules if error and r.matches(error)]
        if rules:
            self._spawn(self._count(rules, shaping.destinations(mail.mail.recipients, self._sites)))

    async def _count(self, rules: list[shaping.AutoRule], dests: tuple[str, ...]) -> None:
        now = model.utcnow()
        for rule in rules:
            for dest in dests:
                count = await self._store.count_failure(dest, rule.rule_id, now, rule.window)
                if count < rule.threshold or self._fired.get((dest, rule.rule_id), now) > now:
                    continue
                if any(e.destination == dest and e.rule_id == rule.rule_id for e in self.snapshot.effects):
                    continue
                effect = shaping.Effect(dest, rule.rule_id, rule.action, now, now + rule.duration, rule.floor)
                self._fired[(dest, rule.rule_id)] = effect.ends_at
                if not await self._store.put_effect(effect):
                    continue  # another replica fired it first
                FIRED.labels(dest, rule.rule_id, rule.action).inc()
                log.warning("shaping rule fired", extra={
                    "destination": dest, "rule": rule.rule_id, "action": rule.action, "failures": count,
                    "window_s": rule.window.total_seconds(), "ends_at": effect.ends_at.isoformat(),
                    "floor": str(rule.floor) if rule.floor else None})
                self.apply(dataclasses.replace(self.snapshot, effects=(*self.snapshot.effects, effect)))

    def _spawn(self, coro: object) -> None:
        async def guarded() -> None:
            try:
                await coro  # type: ignore[misc]
            except BackendUnavailable as e:
                log.warning("shaping write failed: %s", e)
            except Exception:
                log.exception("shaping write failed")

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

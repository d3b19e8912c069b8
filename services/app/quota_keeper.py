"""Enqueue quotas in one enqueue process (the rules: services/domain/quotas.py).

Shared, at no backend call per mail: every enqueue process (a **member**) writes a heartbeat
(TTL ``MEMBER_TTL_S``) and reads the quotas and the members every ``REFRESH_S``
(services/ports/quotas.py). The heartbeat carries the member's **demand**: the mails and bytes a
second each quota was asked for since the last one, refused ones included. Each member enforces
its fraction of every rate (services/domain/quotas.py ``fraction``: a tenth split evenly, the rest
max-min fair by demand; ``rate / N`` when none asks), the burst in proportion; the fractions add
up to 1, so the members together accept at most ``rate * t + burst + N - 1`` mails (each part's
burst rounded up to one mail), give or take a refresh while the demand moves. A tenant whose calls
all reach one replica (one long-lived gRPC connection) is served its whole rate there.

A new member refuses rate-limited mail (retry after the rest of ``JOIN_AFTER_S``) until every
other member has seen it and re-split; a killed member's share returns to the others within
``MEMBER_TTL_S``.

**How fast a change reaches every replica:** a quota set, changed or cleared is enforced by every
enqueue replica within ``REFRESH_S`` plus one Cassandra read (about 1 s). A depth limit (queued
mails or queued bytes) is checked against the queue's counters as read at the last refresh, which are themselves gathered for
``MAILQUEUE_COUNTER_FLUSH_S``: a queue may pass its depth limit by what all replicas accept in
``REFRESH_S + MAILQUEUE_COUNTER_FLUSH_S``.

If the store cannot be read, the last quotas read stay in force (logged; never fail closed on an
outage of the quota store: the enqueue itself then fails UNAVAILABLE anyway).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import Counter, Gauge

from services.domain import quotas
from services.domain.errors import BackendUnavailable
from services.ports.quotas import QuotaSnapshot, QuotaStore

log = logging.getLogger(__name__)

REFUSED = Counter("mailqueue_quota_refused_total", "Enqueues refused by a quota (nothing written), per quota and limit",
                  ["kind", "subject", "limit"])
LIMIT = Gauge("mailqueue_quota_limit", "Each quota's limit as set (whole cluster): mails/s, bytes/s, queued mails or queued bytes",
              ["kind", "subject", "limit"])
USE = Gauge("mailqueue_quota_use_ratio",
            "How much of a quota is in use, 0 to 1, as this process sees it: its part of the rate's burst, or a "
            "queue's queued mails or bytes over its depth limit (alert before 1: at 1 mails are refused)", ["kind", "subject", "limit"])
MEMBERS = Gauge("mailqueue_quota_members", "Enqueue processes sharing the quota rates, as this process last read them")

#: How often a member reads the quotas and writes its heartbeat.
REFRESH_S = 1.0
#: A refresh failing again and again is said once, then once in this many seconds.
SAY_EVERY_S = 30.0
#: A member whose heartbeat is older than this has left (killed): the others take its share.
MEMBER_TTL_S = 3
#: A new member enforces rates only once every other member has had time to see it.
JOIN_AFTER_S = 1.5 * REFRESH_S

Depth = Callable[[str], Awaitable[quotas.Depth]]


class QuotaKeeper:
    def __init__(self, store: QuotaStore, depth: Depth, member: str | None = None) -> None:
        """``depth(queue)``: the queue's queued mails and bytes from its counters (read once a
        refresh, for the queues with a depth limit only)."""
        self._store = store
        self._depth_of = depth
        self.member = member or uuid.uuid4().hex
        self._quotas: dict[tuple[str, str], quotas.Quota] = {}
        self._limiters: dict[tuple[tuple[str, str], str], quotas.Gcra] = {}
        self._depth: dict[str, quotas.Depth] = {}
        self._members = 1
        self._seen_since: float | None = None
        #: What each quota was asked for since the last heartbeat (demand key -> mails or bytes).
        self._asked: dict[str, float] = {}
        #: The stream of each quota that is never refused until it ends (``stream``).
        self._streams: dict[tuple[str, str], quotas.Charge] = {}
        self._asked_since = time.monotonic()
        #: Set once refreshed (until then no quota is known: nothing is refused; enqueue_svc waits
        #: for it before it serves, ``wait_loaded``).
        self._loaded = asyncio.Event()

    async def run_forever(self) -> None:
        failures, since, said = 0, 0.0, 0.0
        while True:
            try:
                await self.refresh()
            except BackendUnavailable as e:
                now = time.monotonic()
                failures, since = failures + 1, since if failures else now
                if failures == 1 or now - said >= SAY_EVERY_S:  # once, then every 30 s (it was every second)
                    said = now
                    log.warning("quotas not refreshed%s (the last ones read stay in force): %s",
                                f" for {now - since:.0f} s" if failures > 1 else "", e, extra={"failures": failures})
            except Exception:  # a bug must not stop the refresh for the life of the process
                log.exception("quotas not refreshed")
            else:
                if failures:
                    log.info("quotas refreshed again", extra={"failures": failures})
                failures = 0
            await asyncio.sleep(REFRESH_S)

    async def refresh(self) -> None:
        now = time.monotonic()
        asked, since = self._asked, self._asked_since
        self._asked, self._asked_since = {}, now  # what comes meanwhile counts for the next heartbeat
        demand = {k: v / max(now - since, 1e-3) for k, v in asked.items()}
        try:
            await self._store.heartbeat(self.member, MEMBER_TTL_S, demand)
        except BaseException:  # not said: counted again with the next one
            for k, v in asked.items():
                self._asked[k] = self._asked.get(k, 0.0) + v
            self._asked_since = since
            raise
        snap = await self._store.snapshot()
        depth = {}
        for q in snap.quotas:
            if q.kind == "queue" and q.has_depth:
                depth[q.subject] = await self._depth_of(q.subject)
        self.apply(snap, depth, demand)

    async def wait_loaded(self, timeout_s: float) -> bool:
        """Whether the quotas were read within ``timeout_s`` (run_forever reads them)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._loaded.wait()
        except TimeoutError:
            return False
        return True

    async def leave(self) -> None:
        await self._store.leave(self.member)

    def apply(self, snap: QuotaSnapshot, depth: dict[str, quotas.Depth], own: Mapping[str, float] | None = None) -> None:
        """Take a snapshot in: the quotas, this member's split of their rates (a limiter whose
        rate changed keeps its state), the depths. ``own``: this member's demand, for when its
        heartbeat is not in the snapshot yet."""
        # Once seen, a member stays joined: its heartbeat may expire between a slow write and the
        # read (a loaded store), and refusing every rated mail meanwhile would be worse than the
        # others' larger share for that moment.
        if self.member in snap.members:
            self._seen_since = self._seen_since or time.monotonic()
        members = set(snap.members) | {self.member}
        self._members = len(members)
        MEMBERS.set(self._members)
        demand = dict(snap.demand)
        if self.member not in demand and own is not None:
            demand[self.member] = own
        # The series of every limit no longer set: a quota cleared, or replaced without that limit
        # (left, a limit's last value and use would be exported, and alerted on, for good).
        kept = {(q.kind, q.subject, limit) for q in snap.quotas for limit, value in _limits(q) if value is not None}
        for q in self._quotas.values():
            for limit, _ in _limits(q):
                if (q.kind, q.subject, limit) in kept:
                    continue
                for g in (LIMIT, USE):
                    # NaN first: with several workers (prometheus_client's multiprocess mode)
                    # remove() keeps the series, which must then show no value, not the last.
                    g.labels(q.kind, q.subject, limit).set(float("nan"))
                    try:
                        g.remove(q.kind, q.subject, limit)
                    except KeyError:
                        pass
        self._quotas = {q.key: q for q in snap.quotas}
        limiters = {}
        for q in snap.quotas:
            fractions = {what: quotas.fraction(rate, {m: demand.get(m, {}).get(demand_key(q.key, what), 0.0) for m in members},
                                               self.member)
                         for what, rate in (("mails", q.mails_per_s), ("bytes", q.bytes_per_s)) if rate is not None}
            for what, (rate, burst) in quotas.split(q, fractions).items():
                found = self._limiters.get((q.key, what))
                if found is None:
                    found = quotas.Gcra(rate, burst)
                found.rate, found.burst = rate, burst
                limiters[(q.key, what)] = found
            for limit, value in _limits(q):
                if value is not None:
                    LIMIT.labels(q.kind, q.subject, limit).set(value)
        self._limiters = limiters
        self._depth = depth
        self._loaded.set()
        self._export_use()

    def _export_use(self) -> None:
        now = time.monotonic()
        for (key, what), g in self._limiters.items():
            USE.labels(key[0], key[1], f"{what}_per_s").set(g.use(now, 1.0 if what == "mails" else 0.0))
        for q in self._quotas.values():
            held = self._depth.get(q.subject, quotas.Depth())
            if q.max_queued_mails is not None:
                USE.labels(q.kind, q.subject, "max_queued_mails").set(held.mails / q.max_queued_mails)
            if q.max_queued_bytes is not None:
                USE.labels(q.kind, q.subject, "max_queued_bytes").set(held.bytes / q.max_queued_bytes)

    def check(self, facts: quotas.Facts, charge: quotas.Charge | None = None) -> None:
        """Take the mail of ``facts`` from every quota that applies, recorded in ``charge`` (to give
        back if the mail is not enqueued after all), or raise QuotaExceeded (nothing taken). Costs
        no backend call."""
        if not self._quotas:
            return
        applying = quotas.applying(self._quotas, facts)
        if not applying:
            return
        for q in applying:  # the demand, refused or not: what this member's share should be
            if q.mails_per_s is not None:
                self._ask(q.key, "mails", 1.0)
            if q.bytes_per_s is not None and facts.size:
                self._ask(q.key, "bytes", float(facts.size))
        wait = self._joining()
        if wait is not None and any(q.mails_per_s or q.bytes_per_s for q in applying):
            q = next(q for q in applying if q.mails_per_s or q.bytes_per_s)
            self._refuse(quotas.Refusal(q.kind, q.subject, "mails_per_s" if q.mails_per_s else "bytes_per_s",
                                        max(wait, quotas.MIN_RETRY_S),
                                        f"this enqueue replica is joining the {q.kind} {q.subject} quota"))
        refusal = quotas.decide(applying, self._limiters, self._depth, facts, time.monotonic(), charge)
        if refusal is not None:
            self._refuse(refusal)

    def stream(self, facts: quotas.Facts, size: int, stream: quotas.Charge) -> None:
        """Take ``size`` more bytes of a mail being streamed (``stream``: its charge, the same for
        each of its chunks, which records them) from its byte quotas as they arrive, or raise
        QuotaExceeded (nothing of them taken): streams at once share a byte quota as mails of known size do (charged
        once streamed, they all passed it together). One stream of a quota at a time is never
        refused: the first to take bytes while the quota had room, until it ends (it may owe, as
        a mail larger than the burst does), so one always goes through; the quota is never lent
        to the next while it owes."""
        if not self._quotas:
            return
        now = time.monotonic()
        limited = [(q, self._limiters.get((q.key, "bytes"))) for q in quotas.applying(self._quotas, facts) if q.bytes_per_s]
        for q, limiter in limited:
            self._ask(q.key, "bytes", float(size))
            # A chunk larger than the burst passes an idle limiter (and owes the rest), as a mail does.
            wait = limiter.wait(now, min(size, limiter.burst)) if limiter is not None else 0.0
            if wait <= 0:
                self._streams.setdefault(q.key, stream)
            elif self._streams.get(q.key) is not stream:
                self._refuse(quotas.rate_refusal(q, "bytes", wait))
        for _, limiter in limited:
            if limiter is not None:
                stream.take(limiter, now, size)

    def stream_ended(self, stream: quotas.Charge) -> None:
        """The stream of ``stream`` ended (stored, refused or left)."""
        for key in [k for k, s in self._streams.items() if s is stream]:
            del self._streams[key]

    def _ask(self, key: tuple[str, str], what: str, amount: float) -> None:
        name = demand_key(key, what)
        self._asked[name] = self._asked.get(name, 0.0) + amount

    def _joining(self) -> float | None:
        if self._members == 1 and self._seen_since is not None:
            return None
        if self._seen_since is None:
            return JOIN_AFTER_S
        left = JOIN_AFTER_S - (time.monotonic() - self._seen_since)
        return left if left > 0 else None

    def _refuse(self, refusal: quotas.Refusal) -> None:
        REFUSED.labels(refusal.kind, refusal.subject, refusal.limit).inc()
        raise quotas.QuotaExceeded(refusal)


def _limits(q: quotas.Quota) -> tuple[tuple[str, float | int | None], ...]:
    """A quota's four limits by their metric label, set or not."""
    return (("mails_per_s", q.mails_per_s), ("bytes_per_s", q.bytes_per_s),
            ("max_queued_mails", q.max_queued_mails), ("max_queued_bytes", q.max_queued_bytes))


def demand_key(key: tuple[str, str], what: str) -> str:
    """A quota's rate ("mails" or "bytes") as a heartbeat names its demand: ``kind|subject|what``."""
    return f"{key[0]}|{key[1]}|{what}"

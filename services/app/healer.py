"""The healer: repairs the projections by itself, no operator call (seed 003, DESIGN "Healing").

Runs in every browse_svc replica; one at a time does the work, holding the ``healer`` lease
(renewed each round; a killed holder's lease ends with its TTL and another replica takes over).
Two holders overlapping (a lease lost mid-round) do no harm: every repair is idempotent.

Each round, for every queue:

0. A deleted queue's browse start moves on (its content is the retention sweep's).
1. **Interrupted moves and redrives**: a MoveMails or RedriveDeadLetters journal entry begun more
   than the grace ago is completed (services/app/moves.py, services/app/dead_letter_book.py).
2. **One exact pass** over the queue's live mails (what ReconcileCounters reads).
3. **Counters**: the drift of the queue's size between its counters and that pass is corrected
   when the same drift is seen in two rounds in a row (a drift seen once may be updates in flight between the pass
   and the counters' read; a real one stays). The dead-letter counters likewise, against the
   repository (a dequeue_svc killed between keeping a dead letter and counting it).
4. **Rows without a message** (an Enqueue killed between its row and its publish): when the
   queue's work queues hold no ready message, a live mail that became deliverable more than the
   grace ago and is still there has no message waiting, so it is published again under a new
   generation (``reschedule``, as Flush does): an old copy that still exists somewhere (in the
   delay ladder, or handed out and answered later) is stale and skipped, so the mail is delivered
   once. While the queue has a backlog this waits: the mail may just be behind it.

Cost per queue and round: the pass reads every live mail from the browse start (one read per
slice and bucket, plus the rows), the counters partition once, the two journal partitions once,
the kind column of the queue's dead letters, and three passive queue declarations. At the default interval of 300 s that is 12 passes an hour per
queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid

from prometheus_client import Counter

from services.app import browse_start
from services.app.dead_letter_book import DeadLetterBook
from services.app.moves import Mover
from services.domain import counts, model
from services.domain.errors import BackendUnavailable, NotFound
from services.ports.broker import Broker
from services.ports.view import View

log = logging.getLogger(__name__)

HEALED = Counter("mailqueue_healer_repairs_total", "Repairs the healer made", ["queue", "kind"])
ROUNDS = Counter("mailqueue_healer_rounds_total", "Healer rounds this replica ran holding the lease")

LEASE = "healer"


@dataclasses.dataclass
class Healed:
    moves: int = 0
    redrives: int = 0
    counters: int = 0
    dead_letter_counters: int = 0
    republished: int = 0


class Healer:
    def __init__(self, view: View, broker: Broker, live_mails, mover: Mover,  # noqa: ANN001 - Browser.live_mails
                 book: DeadLetterBook, interval_s: float, grace_s: float) -> None:
        self._view = view
        self._book = book
        self._broker = broker
        self._live_mails = live_mails
        self._mover = mover
        self.interval_s = interval_s
        self.grace = dt.timedelta(seconds=grace_s)
        self.member = uuid.uuid4().hex
        self._drift: dict[str, list[tuple[dt.datetime, str, int]]] = {}
        self._dead_drift: dict[str, list[tuple[str, int]]] = {}

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # the first round one interval after start-up
            try:
                if await self._view.leases.hold(LEASE, self.member, max(int(3 * self.interval_s), 1)):
                    ROUNDS.inc()
                    await self.heal_all()
            except BackendUnavailable as e:
                log.warning("healer round skipped: %s", e)
            except Exception:  # a bug must not stop healing for the life of the process
                log.exception("healer round failed")

    async def heal_all(self) -> None:
        queues = await self._view.queues.all()
        for queue in queues:
            try:
                await self.heal(queue)
            except NotFound:
                continue  # deleted meanwhile
        for queue in set(await self._view.queues.all_dropped()) - set(queues):
            await browse_start.update(self._view, queue)  # its slices become the sweep's

    async def heal(self, queue: str) -> Healed:
        h = Healed()
        now = model.utcnow()
        for mail, moved, begun in await self._view.moves.pending(queue):
            if now - begun > self.grace:
                await self._mover.complete(mail, moved)
                h.moves += 1
        h.redrives = await self._book.complete_interrupted(queue, self.grace)
        h.dead_letter_counters = await self._dead_letter_counters(queue)
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return h
        now = model.utcnow()
        live = [q async for q in self._live_mails(queue, "heal")]
        h.counters = await self._counters(queue, live, start, now)
        stranded = [q for q in live if q.due() < now - self.grace and not counts.is_held(q)]
        if stranded and await self._broker.ready_messages(queue) == 0:
            for q in stranded:
                again = dataclasses.replace(q, generation=q.generation + 1)
                await self._broker.publish(again)
                await self._view.mails.reschedule(again)
                h.republished += 1
        for kind, n in (("move", h.moves), ("redrive", h.redrives), ("counter", h.counters),
                        ("dead_letter_counter", h.dead_letter_counters), ("republish", h.republished)):
            if n:
                HEALED.labels(queue, kind).inc(n)
        if any(dataclasses.astuple(h)):
            log.warning("healed", extra={"queue": queue, **dataclasses.asdict(h)})
        return h

    async def _dead_letter_counters(self, queue: str) -> int:
        """The dead-letter counters against the repository (its kind column), corrected when the
        same drift is seen in two rounds in a row (as the size counters: a dead letter recorded
        or removed between the two reads is not a drift); the corrections made."""
        exact, counted = await self._view.dead_letters.exact_counts(queue), await self._view.dead_letters.counts(queue)
        drift = sorted((kind, n - counted.get(kind, 0)) for kind, n in exact.items() if n != counted.get(kind, 0))
        seen_before, self._dead_drift[queue] = self._dead_drift.get(queue, []), drift
        confirmed = [d for d in drift if d in seen_before]
        for kind, delta in confirmed:
            await self._view.dead_letters.correct(queue, kind, delta)
        if confirmed:
            self._dead_drift[queue] = []
        return len(confirmed)

    async def _counters(self, queue: str, live: list[model.QueuedMail], start: dt.datetime, now: dt.datetime) -> int:
        """Correct the drift seen in this round and the last; the corrections made."""
        raw = await self._view.counters.read(queue, counts.KINDS, start)
        # The size only: a delayed count stays "delayed" until a consumer takes the mail after its
        # time, where the pass already sees it ready (ReconcileCounters rewrites those).
        drift = sorted(d for d in counts.exact_deltas(raw, live, start, now) if d[1] == "gone")
        seen_before, self._drift[queue] = self._drift.get(queue, []), drift
        confirmed = [d for d in drift if d in seen_before]
        for s, kind, delta in confirmed:
            await self._view.counters.add(queue, kind, s, delta)
        if confirmed:
            self._drift[queue] = []
        return len(confirmed)


"""The healer: repairs the projections by itself, no operator call (seed 003, DESIGN "Healing").

Runs in every browse_svc replica; one at a time does the work, holding the ``healer`` lease
(renewed each round; a killed holder's lease ends with its TTL and another replica takes over).
Two holders overlapping (a lease lost mid-round) do no harm: every repair is idempotent.

Each round, for every queue:

0. A deleted queue's browse start moves on (its content is the retention sweep's).
1. **Interrupted moves and redrives**: a MoveMails or RedriveDeadLetters journal entry begun more
   than the grace ago is completed (services/app/moves.py, services/app/dead_letter_admin.py).
2. **An exact pass** over the queue's live mails (what ReconcileCounters reads), at most
   ``rows_per_round`` rows (MAILQUEUE_HEAL_ROWS_PER_ROUND) per round: the pass goes on where the
   last round stopped (the read's paging state), so a deep queue is passed over in several
   rounds and a round costs the same at any depth.
3. **Counters**: each slice the pass has read to its end is checked against its counters; a
   slice's drift is corrected when the same drift is seen in two passes in a row (a drift seen
   once may be updates in flight between the pass and the counters' read; a real one stays). The
   dead-letter counters likewise, against the repository (a dequeue_svc killed between keeping a
   dead letter and counting it), every DEAD_LETTER_ROUNDS rounds: that check reads every dead
   letter's kind, the one part of a round that grows with what the queue keeps.
4. **Rows without a message** (an Enqueue killed between its row and its publish): when the
   queue's work queues hold no ready message, a live mail that became deliverable more than the
   grace ago may have no message waiting. It may also be in a consumer's hands, handed out and
   not answered yet: the last mails of a backlog that drains are, and the broker counts them as
   neither ready nor gone. So such a row is a suspect first, and is published again only when it
   has been seen so, in every round that read it, for a whole grace: a delivery answered
   meanwhile takes it out of the live mails, a row that stays has no message. It is published
   under a new generation (``reschedule``, as Flush does): an old copy that still exists
   somewhere (in the delay ladder) is stale and skipped, so the mail is delivered once. While the
   queue has a backlog this waits: the mail may just be behind it. Only the rows this round read
   are looked at. A consumer that holds one mail unanswered for longer than the grace while its
   queue has no ready message gets it again: the grace (900 s by default) is chosen above the
   longest delivery. A mail waiting for room at a throttled destination (in the delay ladder, its
   row unchanged) is no suspect while its destination has mails waiting. A held mail whose
   recheck is overdue by the grace lost its message too: published again, it is judged again
   (held again while its rule is in force, delivered once it is not).

Cost per queue and round: at most ``rows_per_round`` mail rows and their marks (plus a page per
bucket read ahead), the counters partition once, the two journal partitions once, the kind
column of the queue's dead letters, and three passive queue declarations. A queue under
``rows_per_round`` deep (20,000 by default) is passed over whole in each round, every 300 s by
default; a deeper one every ``depth / rows_per_round`` rounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator

from prometheus_client import Counter, Histogram

from services.app import admin_events, browse_start
from services.app.dead_letter_admin import DeadLetterAdmin
from services.app.moves import Mover
from services.domain import counts, model, shaping
from services.domain.errors import BackendUnavailable, NotFound
from services.domain.events import Event, acting_as
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

log = logging.getLogger(__name__)

HEALED = Counter("mailqueue_healer_repairs_total", "Repairs the healer made", ["queue", "kind"])
ROUNDS = Counter("mailqueue_healer_rounds_total", "Healer rounds this replica ran holding the lease")
ROUND_SECONDS = Histogram("mailqueue_healer_round_seconds", "How long a healer round took (every queue)",
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))

LEASE = "healer"
#: The dead-letter counters are checked against the repository every this many rounds of a queue
#: (the first included): the check reads the kind of every dead letter the queue keeps (a week
#: of them by default), which every round (5 minutes) would be most of a round's reads.
DEAD_LETTER_ROUNDS = 12


@dataclasses.dataclass
class _Pass:
    """An exact pass over one queue's live mails, spread over rounds."""

    start: dt.datetime  # the browse start it began at
    rows: AsyncIterator[model.QueuedMail]  # where the last round stopped
    live: dict[dt.datetime, int] = dataclasses.field(default_factory=dict)  # live mails per slice so far
    bytes: dict[dt.datetime, int] = dataclasses.field(default_factory=dict)  # their sizes per slice so far
    checked: dt.datetime = dt.datetime.min.replace(tzinfo=dt.timezone.utc)  # slices before it are checked
    suspects: set[tuple[uuid.UUID, int]] = dataclasses.field(default_factory=set)  # suspects read so far


@dataclasses.dataclass
class Healed:
    moves: int = 0
    redrives: int = 0
    counters: int = 0
    dead_letter_counters: int = 0
    republished: int = 0


class Healer:
    def __init__(self, view: View, broker: Broker, live_mails, mover: Mover,  # noqa: ANN001 - Browser.live_mails
                 dead_letter_admin: DeadLetterAdmin, interval_s: float, grace_s: float, rows_per_round: int = 20_000,
                 events: EventLog | None = None) -> None:
        self._view = view
        self._events = events
        self._dead_letter_admin = dead_letter_admin
        self._broker = broker
        self._live_mails = live_mails
        self._mover = mover
        self.interval_s = interval_s
        self.grace = dt.timedelta(seconds=grace_s)
        self.rows_per_round = rows_per_round
        self._passes: dict[str, _Pass] = {}
        self.member = uuid.uuid4().hex
        self._drift: dict[str, dict[tuple[dt.datetime, str], int]] = {}  # per queue, each (slice, counter)'s drift when last checked
        self._dead_drift: dict[str, list[tuple[str, int]]] = {}
        self._dead_rounds: dict[str, int] = {}  # per queue, its rounds since the first (``DEAD_LETTER_ROUNDS``)
        #: Per queue, the rows suspected of having no message, and since when (see ``_stranded``).
        self._suspected: dict[str, dict[tuple[uuid.UUID, int], dt.datetime]] = {}

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)  # the first round one interval after start-up
            try:
                if await self._view.leases.hold(LEASE, self.member, max(int(3 * self.interval_s), 1)):
                    ROUNDS.inc()
                    with ROUND_SECONDS.time():
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
        """One queue healed; what it changes is recorded as the healer's (actor component "healer").
        Its repairs are counted and logged however the round ends: one that fails half-way still
        made those before."""
        h = Healed()
        with acting_as(admin_events.HEALER):
            try:
                await self._heal(queue, h)
            finally:
                _counted(queue, h)
        return h

    async def _heal(self, queue: str, h: Healed) -> None:
        now = model.utcnow()
        pending: list[tuple[model.QueuedMail, Event]] = []
        for mail, moved, begun in await self._view.moves.pending(queue):
            if now - begun > self.grace:
                await self._mover.complete(mail, moved, pending)
                h.moves += 1
        await self._mover.finish(pending)
        h.redrives = await self._dead_letter_admin.complete_interrupted(queue, self.grace)
        rounds = self._dead_rounds[queue] = self._dead_rounds.get(queue, -1) + 1
        if rounds % DEAD_LETTER_ROUNDS == 0:  # it reads every dead letter's kind: not every round
            h.dead_letter_counters = await self._dead_letter_counters(queue)
        start = await self._view.starts.browse_start(queue)
        if start is None:
            self._passes.pop(queue, None)
            return
        now = model.utcnow()
        read, p, finished = await self._read_on(queue, start)
        h.counters = await self._counters(queue, p, None if finished else read[-1].slice_start if read else p.checked)
        if finished:
            del self._passes[queue]
        suspects = [q for q in read if q.due() < now - self.grace]
        if suspects and await self._broker.ready_messages(queue) != 0:
            suspects = []  # behind a backlog, maybe: nothing is suspect while messages wait
        if suspects:
            suspects = await self._not_waiting_for_room(suspects)
        stranded = self._stranded(queue, read, suspects, p, finished, now)
        if stranded:
            # Recorded first (same ids when the next round publishes them again after a crash).
            await admin_events.record(self._events, [admin_events.republished(
                dataclasses.replace(q, generation=q.generation + 1)) for q in stranded])
            for q in stranded:
                again = dataclasses.replace(q, generation=q.generation + 1)
                # A held mail's hold counted it delayed and held until its message arrives: this
                # copy's arrival ends both (services/app/actions.py end_delay), as that one's would have.
                await self._broker.publish(again, counted=True if counts.is_held(q) else None)
                await self._view.mails.reschedule(again)
                h.republished += 1

    async def _not_waiting_for_room(self, suspects: list[model.QueuedMail]) -> list[model.QueuedMail]:
        """The suspects none of whose destinations has mails waiting for room (traffic shaping): a
        mail waiting for its slot is in the delay ladder, its row unchanged and overdue; published
        again, it would lose its place and burn a slot. Like a backlog, a destination's wait
        suspends suspicion (the dequeue members' heartbeats say which destinations have mails waiting)."""
        snap = await self._view.shaping.snapshot()
        busy = {d.destination for d in shaping.status(snap.members) if d.waiting}
        if not busy:
            return suspects
        sites = shaping.site_of(snap.sites)
        return [q for q in suspects if busy.isdisjoint(shaping.destinations(q.mail.recipients, sites))]

    def _stranded(self, queue: str, read: list[model.QueuedMail], suspects: list[model.QueuedMail], p: _Pass,
                  finished: bool, now: dt.datetime) -> list[model.QueuedMail]:
        """The suspects seen without a message for a whole grace: since the first round that saw
        them so, every round that read them did. A row read again and no longer suspect (answered,
        rescheduled, a message waiting) starts over; at the end of a pass, the suspects it did not
        read (gone) are forgotten."""
        since = self._suspected.setdefault(queue, {})
        suspect = {(q.enqueue_id, q.generation) for q in suspects}
        p.suspects |= suspect
        for q in read:
            key = (q.enqueue_id, q.generation)
            if key in suspect:
                since.setdefault(key, now)
            else:
                since.pop(key, None)
        stranded = [q for q in suspects if now - since[(q.enqueue_id, q.generation)] >= self.grace]
        if finished:
            self._suspected[queue] = {k: t for k, t in since.items() if k in p.suspects}
        return stranded

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

    async def _read_on(self, queue: str, start: dt.datetime) -> tuple[list[model.QueuedMail], _Pass, bool]:
        """This round's rows of the queue's pass (begun now if none is going on): at most
        ``rows_per_round``; and whether the pass reached its end."""
        p = self._passes.get(queue)
        if p is None:
            page = min(self.rows_per_round, 5000)
            p = self._passes[queue] = _Pass(start, self._live_mails(queue, "heal", first_page=page, max_page=page), checked=start)
        read: list[model.QueuedMail] = []
        try:
            while len(read) < self.rows_per_round:
                read.append(await anext(p.rows))
        except StopAsyncIteration:
            return self._counted(p, read), p, True
        except BaseException:
            self._passes.pop(queue, None)  # the next round begins a new pass
            raise
        return self._counted(p, read), p, False

    @staticmethod
    def _counted(p: _Pass, read: list[model.QueuedMail]) -> list[model.QueuedMail]:
        for q in read:
            p.live[q.slice_start] = p.live.get(q.slice_start, 0) + 1
            p.bytes[q.slice_start] = p.bytes.get(q.slice_start, 0) + q.size
        return read

    async def _counters(self, queue: str, p: _Pass, upto: dt.datetime | None) -> int:
        """Check the slices the pass has read to their end since the last check (those before
        ``upto``; None: all) and correct the drift a slice showed in this pass and the last; the
        corrections made. The size and the queued bytes only: a delayed count stays "delayed"
        until a consumer takes the mail after its time (ReconcileCounters rewrites those)."""
        if upto is not None and upto <= p.checked:
            return 0
        raw = await self._view.counters.read(queue, counts.KINDS, p.start)
        drift = {(s, "gone"): d for s, d in counts.gone_deltas(raw, p.live, p.checked, upto).items()}
        drift.update({(s, "bytes"): d for s, d in counts.bytes_deltas(raw, p.bytes, p.checked, upto).items()})
        seen = self._drift.setdefault(queue, {})
        confirmed = {k: d for k, d in drift.items() if seen.get(k) == d}
        for k in [k for k in seen if k[0] >= p.checked and (upto is None or k[0] < upto)]:
            del seen[k]  # checked again now: only this pass's drift counts next time
        seen.update({k: d for k, d in drift.items() if k not in confirmed})
        for (s, kind), delta in confirmed.items():
            await self._view.counters.add(queue, kind, s, delta)
        if upto is not None:
            p.checked = upto
        return len(confirmed)


def _counted(queue: str, h: Healed) -> None:
    """A round's repairs of ``queue``: in the metric and in the log."""
    for kind, n in (("move", h.moves), ("redrive", h.redrives), ("counter", h.counters),
                    ("dead_letter_counter", h.dead_letter_counters), ("republish", h.republished)):
        if n:
            HEALED.labels(queue, kind).inc(n)
    if any(dataclasses.astuple(h)):
        log.warning("healed", extra={"queue": queue, **dataclasses.asdict(h)})

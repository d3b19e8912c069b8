"""The operators' side of dead letters (browse_svc): browse them with why they died, count them by
kind, redrive them (back to their queue or to another, at most N per second, attempts reset or
kept), purge them. The repository is written by dequeue_svc (services/app/dead_letter_recorder.py).

A redrive takes each dead letter in four steps, so that one interrupted anywhere (a SIGKILL of
browse_svc, a backend outage) loses nothing and delivers each mail once:

1. it is journaled (``moves_v1``, partition ``dead-letters/<queue>``: no queue has such a name):
   the dead letter and the mail as it lands, with a new enqueue id;
2. the dead letter leaves the repository (it is no longer listed or counted);
3. the mail lands: stored, counted, published (services/app/moves.py ``land``);
4. its REDRIVEN event is recorded (services/app/admin_events.py; in batches of at most
   ``admin_events.JOURNALED_BATCH``, and before each progress message), then the journal entry
   is removed.

The next redrive of the queue first completes what the journal holds, and so does the healer for
entries older than its grace. Steps 2 and 3 done twice remove nothing more and publish one
enqueue id twice: delivered once.

A purge records PURGED for its dead letters (in batches), then removes them from the repository; their content is then the retention sweep's
(blobs no row and no dead letter references).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator

from services.app import admin_events
from services.app.browser import Browser
from services.app.moves import Mover, land, publish_landed
from services.domain import dead_letters, model, paging
from services.domain.dead_letters import DeadLetter, DeadLetterFilter
from services.domain.errors import Aborted, InvalidArgument
from services.domain.events import Event
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

log = logging.getLogger(__name__)


def position(d: DeadLetter) -> paging.Position:
    """Where a dead letter sorts in BrowseDeadLetters: its hour of enqueue, enqueue time and id."""
    return paging.Position.of(dead_letters.hour_of(d.mail.enqueued_at), d.mail.enqueued_at, d.mail.enqueue_id)

#: Progress is streamed at least this often (seconds) while a redrive or a purge runs.
PROGRESS_S = 1.0


def journal(queue: str) -> str:
    """The redrive journal's partition for a queue's dead letters."""
    return f"dead-letters/{queue}"


@dataclasses.dataclass
class RedriveProgress:
    scanned: int = 0
    redriven: int = 0
    #: Redrives an interrupted one had begun, completed by this one.
    resumed: int = 0
    done: bool = False


@dataclasses.dataclass
class PurgeProgress:
    scanned: int = 0
    purged: int = 0
    done: bool = False


async def purge_one(view: View, mail: model.QueuedMail) -> bool:
    """Forget a dead letter (False when it was gone already). Its mail is marked purged first, so
    a broker copy redelivered afterwards is not kept again (services/app/dead_letter_recorder.py)."""
    await view.mails.mark(mail.queue, mail.enqueue_id, dead_letters.PURGED_REASON)
    return await view.dead_letters.remove(mail)


#: Exact passes ReconcileCounters takes over dead letters whose counters move meanwhile.
RECONCILE_PASSES = 3


class DeadLetterAdmin:
    def __init__(self, view: View, broker: Broker, browser: Browser, mover: Mover, events: EventLog | None = None) -> None:
        self._view = view
        self._events = events
        self._broker = broker
        self._existing = browser.existing
        self._mover = mover

    async def browse(
        self, queue: str, f: DeadLetterFilter, limit: int = 0, page_size: int = 0, page_token: str = "",
    ) -> AsyncIterator[tuple[DeadLetter, str]]:
        """The dead letters matching ``f`` (by hour of enqueue, then enqueue time and id), each with
        the next page's token on the last of a page that more follow (else empty): at most
        ``limit``, or a page at a time (services/domain/paging.py, as Browse)."""
        key = paging.request_key(queue, f)
        page = paging.request(page_size, page_token, limit, paging.DEAD_LETTERS, key)
        await self._existing(queue)
        matching = self._matching(queue, f, limit or (page.size + 1 if page.size else 0), page.after)
        async for d, token in paging.paged(matching, page.size, lambda d: paging.encode(paging.DEAD_LETTERS, key, position(d))):
            yield d, token

    async def _matching(self, queue: str, f: DeadLetterFilter, limit: int, after: paging.Position | None) -> AsyncIterator[DeadLetter]:
        sent = 0
        async for d in self._view.dead_letters.scan(queue, after):
            if f.matches(d):
                yield d
                sent += 1
                if limit and sent >= limit:
                    return

    async def counts(self, queue: str, exact: bool) -> dict[str, int]:
        """Dead letters by kind: from counters (one read), or read from the repository when ``exact``."""
        await self._existing(queue)
        if exact:
            return await self._view.dead_letters.exact_counts(queue)
        return await self._view.dead_letters.counts(queue)

    async def reconcile(self, queue: str) -> dict[str, int]:
        """Rewrite the queue's dead-letter counters from the repository (ReconcileCounters),
        recorded first (COUNTERS_RECONCILED) as every operator change. The counters are read
        before and after the exact pass, and the pass taken again while they moved (a dead letter
        recorded meanwhile: its row read or not, its count added or not): Aborted after three."""
        for _ in range(RECONCILE_PASSES):
            counted = await self._view.dead_letters.counts(queue)
            exact = await self._view.dead_letters.exact_counts(queue)
            if await self._view.dead_letters.counts(queue) == counted:
                break
        else:
            raise Aborted(f"dead letters of queue {queue!r} are being recorded or removed: reconcile again once they settle")
        corrections = {k: n - counted.get(k, 0) for k, n in exact.items() if n != counted.get(k, 0)}
        if corrections:
            await admin_events.record(self._events, [admin_events.dead_letter_counters_reconciled(queue, corrections)])
        for kind, delta in corrections.items():
            await self._view.dead_letters.correct(queue, kind, delta)
        return exact

    async def redrive(
        self, queue: str, f: DeadLetterFilter, target: str, per_second: int, keep_attempts: bool, limit: int = 0,
    ) -> AsyncIterator[RedriveProgress]:
        await self._existing(queue)
        target = await self._existing(target or queue)
        pacer = dead_letters.Pacer(dead_letters.redrive_rate(per_second), time.monotonic())
        p = RedriveProgress()
        p.resumed = await self.complete_interrupted(queue, dt.timedelta(0))
        yield dataclasses.replace(p)
        shown = time.monotonic()
        pending: list[tuple[model.QueuedMail, Event]] = []
        async for d in self._view.dead_letters.scan(queue):
            p.scanned += 1
            if f.matches(d):
                await asyncio.sleep(pacer.delay(time.monotonic()))
                if await self._redrive_one(d, await self._landing(d, target, keep_attempts), pending):
                    p.redriven += 1
                if len(pending) >= admin_events.JOURNALED_BATCH:
                    await self._finish(pending)
                if limit and p.redriven >= limit:
                    break
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                await self._finish(pending)  # a slow redrive records as it goes
                yield dataclasses.replace(p)
        await self._finish(pending)
        await self._view.counter_buffer.flush()
        p.done = True
        log.info("dead letters redriven", extra={"queue": queue, "target": target, "redriven": p.redriven, "resumed": p.resumed})
        yield p

    async def purge(self, queue: str, f: DeadLetterFilter, everything: bool) -> AsyncIterator[PurgeProgress]:
        if f.empty and not everything:
            raise InvalidArgument("a purge needs a condition (sender, recipient, name, reasons, dead-lettered before/after, "
                                  "older_than) or all = true")
        await self._existing(queue)
        p = PurgeProgress()
        shown = time.monotonic()
        batch = admin_events.RecordedFirst(self._events, lambda m: purge_one(self._view, m))
        async for d in self._view.dead_letters.scan(queue):
            p.scanned += 1
            if f.matches(d):
                p.purged += await batch.add(d.mail, admin_events.purged(d.mail))
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                yield dataclasses.replace(p)
        p.purged += await batch.flush()
        p.done = True
        log.warning("dead letters purged", extra={"queue": queue, "purged": p.purged})
        yield p

    async def complete_interrupted(self, queue: str, older_than: dt.timedelta) -> int:
        """Steps 2 to 4 for the redrives journaled more than ``older_than`` ago; how many."""
        done, now = 0, model.utcnow()
        pending: list[tuple[model.QueuedMail, Event]] = []
        for dead, landed, begun in await self._view.moves.pending(journal(queue)):
            if now - begun >= older_than and await self._complete(dead, landed, pending):
                done += 1
        await self._finish(pending)
        if done:
            log.warning("interrupted redrives completed", extra={"queue": queue, "redrives": done})
        return done

    async def _redrive_one(self, d: DeadLetter, landed: model.QueuedMail, pending: list[tuple[model.QueuedMail, Event]]) -> bool:
        dead = dataclasses.replace(d.mail, queue=journal(d.mail.queue))
        await self._view.moves.begin(dead, landed)
        return await self._complete(dead, landed, pending)

    async def _complete(self, dead: model.QueuedMail, landed: model.QueuedMail, pending: list[tuple[model.QueuedMail, Event]]) -> bool:
        """Steps 2 and 3; step 4 (the event, then the journal entry removed) left in ``pending``.
        False, the journal entry removed and nothing landed, when the dead letter was purged or
        redriven elsewhere meanwhile, or its target no longer takes mail (it is being deleted)."""
        mail = dataclasses.replace(dead, queue=dead.queue.removeprefix("dead-letters/"))
        reason = dead_letters.redriven_reason(landed.queue, str(landed.enqueue_id))
        state = await self._view.mails.state(mail.queue, mail.enqueue_id)
        current = state.reason if state is not None and state.deleted else None
        gone = current is not None and current != reason and dead_letters.kind_of(current) is None
        if not gone and current != reason and not await self._mover.takes_mail(landed.queue):
            gone = True
        if gone:
            await self._view.moves.done(dead)
            return False
        if current == reason and (target := await self._view.mails.state(landed.queue, landed.enqueue_id)) is not None:
            # Completed again: the landed copy has its landing's schedule, or a mark of its own (a
            # delivery, or its queue's deletion): neither landed again nor a dead letter again,
            # even if its target was deleted since; published if its landing was cut before its
            # publish was recorded (services/app/moves.py ``land``); one to publish in a queue
            # being deleted keeps its journal entry, as in ``Mover.complete``.
            if target.unpublished and not target.deleted:
                if not await self._mover.takes_mail(landed.queue):
                    return False
                await publish_landed(self._view, self._broker, await self._mover.placed(landed))
            pending.append((dead, admin_events.redriven(mail, landed)))
            return True
        if current == reason and not await self._mover.takes_mail(landed.queue):
            # Its dead letter removed (a redrive cut before it landed), never landed, to a queue
            # deleted since: a dead letter again, listed, to be redriven elsewhere.
            await self._view.dead_letters.record(dead_letters.DeadLetter(
                mail, dead_letters.OTHER, f"its redrive to {landed.queue} was cut and that queue deleted since: redrive it again",
                model.utcnow()))
            await self._view.mails.mark(mail.queue, mail.enqueue_id, dead_letters.RETURNED_REASON)
            await self._view.moves.done(dead)
            return False
        # Marked first: a late broker copy of the dead mail then finds it redriven, not dead.
        await self._view.mails.mark(mail.queue, mail.enqueue_id, reason)
        await self._view.dead_letters.remove(mail)
        await land(self._view, self._broker, await self._mover.placed(landed))
        pending.append((dead, admin_events.redriven(mail, landed)))
        return True

    async def _finish(self, pending: list[tuple[model.QueuedMail, Event]]) -> None:
        """Step 4 of the redrives in ``pending``: their events in one record, then their journal entries removed."""
        await admin_events.record(self._events, [e for _, e in pending])
        for dead, _ in pending:
            await self._view.moves.done(dead)
        pending.clear()

    async def _landing(self, d: DeadLetter, target: str, keep_attempts: bool) -> model.QueuedMail:
        """The mail as it lands: a new enqueue id, deliverable now; with its attempts, last error
        and enqueue time (the retry policy goes on from there), or starting over (enqueued now)."""
        q = dataclasses.replace(d.mail, deliver_at=None, held_by=None, generation=0)
        landed = await self._mover.landing(q, target)
        if keep_attempts:
            return dataclasses.replace(landed, deliver_at=None)
        return dataclasses.replace(landed, enqueued_at=model.utcnow(), deliver_at=None, attempts=0, last_error="", generation=0)

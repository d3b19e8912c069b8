"""MoveMails: live mails (ready, delayed or held) of one queue move to another existing queue with
their schedule, attempts and content (the content is shared: blobs are content-addressed).

Each mail moves in four steps, so that a move interrupted anywhere (a SIGKILL of browse_svc, a
backend outage) leaves the mail in exactly one queue, or in the journal:

1. the move is journaled (``moves_v1``): the mail as it was, and as it lands in the target with a
   new enqueue id;
2. the source copy is marked ``moved to <target>`` (its message is skipped from now on);
3. the target copy is stored, counted, and published;
4. its MOVED event is recorded (services/app/admin_events.py; in batches of at most
   ``admin_events.JOURNALED_BATCH``, and before each progress message), then the journal entry
   is removed. A SIGKILL leaves the moves of one batch journaled: the next MoveMails (or the
   healer) completes and records them.

The next MoveMails from the same queue first completes what the journal holds, and so does the
healer (services/app/healer.py) for moves begun longer than its grace ago. Completing again a
move whose step 3 had happened lands nothing: the target copy's schedule record, written with a
lightweight transaction, says it landed (``land``), so it is counted and published once. A
source mail gone meanwhile (delivered, deleted) is not moved. What it cannot prevent: a mail a
consumer of the source was handed just before its move is delivered from both queues (stop the
source's consumers to move mail they could be holding).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator

from services.app import admin_events
from services.app.queue_state import QueueState
from services.domain import model, validation
from services.domain.counts import is_held
from services.domain.errors import InvalidArgument, NotFound
from services.domain.events import Event
from services.domain.filters import BrowseFilter
from services.domain.slices import bucket_of, slice_start
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

log = logging.getLogger(__name__)

MOVED = "moved to "


@dataclasses.dataclass
class MoveProgress:
    scanned: int = 0
    moved: int = 0
    #: Moves an earlier, interrupted MoveMails had begun, completed by this one.
    resumed: int = 0
    done: bool = False


class Mover:
    def __init__(self, view: View, broker: Broker, state: QueueState, candidates,  # noqa: ANN001 - Browser.candidates
                 events: EventLog | None = None) -> None:
        self._view = view
        self._broker = broker
        self._state = state
        self._candidates = candidates
        self._events = events

    async def move(self, source: str, target: str, f: BrowseFilter, limit: int = 0, every: int = 100) -> AsyncIterator[MoveProgress]:
        validation.queue_name(source)
        validation.queue_name(target)
        if source == target:
            raise InvalidArgument("a move needs two different queues")
        await self._state.require_queue(source)
        await self._state.require_queue(target)
        p = MoveProgress()
        pending: list[tuple[model.QueuedMail, Event]] = []
        for mail, moved, _begun in await self._view.moves.pending(source):
            await self.complete(mail, moved, pending)
            p.resumed += 1
        await self.finish(pending)
        if p.resumed:
            log.warning("interrupted moves completed", extra={"queue": source, "moves": p.resumed})
        yield dataclasses.replace(p)
        started = model.utcnow()
        async for q in self._candidates(source, f, "move", until=started + dt.timedelta(milliseconds=1)):
            p.scanned += 1
            if not f.matches(q):
                continue
            moved = await self.landing(q, target)
            await self._view.moves.begin(q, moved)
            if await self.complete(q, moved, pending):
                p.moved += 1
            if len(pending) >= admin_events.JOURNALED_BATCH:
                await self.finish(pending)
            if limit and p.moved >= limit:
                break
            if p.scanned % every == 0:
                await self.finish(pending)  # what the progress says moved is recorded
                yield dataclasses.replace(p)
        await self.finish(pending)
        await self._view.counter_buffer.flush()  # a GetSize here after the answer reflects it
        p.done = True
        log.info("mails moved", extra={"queue": source, "target": target, "moved": p.moved, "resumed": p.resumed})
        yield p

    async def landing(self, q: model.QueuedMail, target: str) -> model.QueuedMail:
        """The mail as it lands in ``target``: a new enqueue id in the current slice, the same
        enqueue time (its age), schedule, attempts, priority and content.

        The new id is derived from the source copy and the target (``landing_id``): two movers of
        one mail (a redrive begun again while the healer completes the interrupted one, two
        MoveMails at once) land the same enqueue id, delivered once, never two mails."""
        config = await self._state.config()
        enqueue_id = landing_id(q, target)
        due = q.due()
        return await self.placed(dataclasses.replace(
            q, queue=target, enqueue_id=enqueue_id, slice_start=slice_start(model.utcnow(), config.slice_window),
            bucket=bucket_of(q.mail.name, str(enqueue_id), config.bucket_count),
            # A retried mail's attempts live in its schedule record, read only for a generation above 0.
            generation=1 if q.attempts or q.last_error else 0, held_by=None, deliver_at=due if due > q.enqueued_at else None,
        ))

    async def takes_mail(self, queue: str) -> bool:
        """Whether ``queue`` takes mail now, as every enqueue sees it: one being deleted does not
        (DeleteQueue waits out this cache before it removes the queue's topology)."""
        try:
            await self._state.require_queue(queue)
        except NotFound:
            return False
        return True

    async def complete(
        self, mail: model.QueuedMail, moved: model.QueuedMail, pending: list[tuple[model.QueuedMail, Event]],
    ) -> bool:
        """Steps 2 and 3 for one journaled move, its step 4 left in ``pending`` (``finish`` records
        the MOVED events of a batch, then removes their journal entries); False when the source
        mail was gone already (nothing recorded)."""
        state = await self._view.mails.state(mail.queue, mail.enqueue_id)
        mark = model.truncated(MOVED + moved.queue)
        if state is not None and state.deleted and state.reason != mark:
            # Delivered, deleted, or moved to another queue by another move meanwhile: nothing to move.
            await self._view.moves.done(mail)
            return False
        if state is None or not state.deleted:
            if not await self.takes_mail(moved.queue):
                if state is not None and state.unpublished:
                    # Put back by a ``restore`` (below) cut before its publish was recorded: the
                    # mail may have no message of its generation.
                    await publish_again(self._view, self._broker, state.applied_to(mail))
                await self._view.moves.done(mail)  # the mail stays where it is
                return False
            await self._view.mails.mark_gone(mail, mark)
        elif (target := await self._view.mails.state(moved.queue, moved.enqueue_id)) is not None:
            # Completed again: the target copy has its landing's schedule, or a mark of its own (a
            # delivery, or its queue's deletion): landed before, it is neither landed again nor
            # put back in its source, even if its target was deleted since (its copy may have been
            # delivered there); published if its landing was cut before its publish was recorded.
            # A copy to publish in a queue being deleted keeps its journal entry: the deletion,
            # refused for that live copy or done with force, decides what the next completion does.
            if target.unpublished and not target.deleted:
                if not await self.takes_mail(moved.queue):
                    return False
                await publish_landed(self._view, self._broker, await self.placed(moved))
            pending.append((mail, admin_events.moved(mail, moved)))
            return True
        elif not await self.takes_mail(moved.queue):
            # Marked moved (a MoveMails cut between its steps 2 and 3), never landed, to a queue
            # deleted since: landed there, it would be in no queue anyone consumes. It goes back
            # to its source.
            await restore(self._view, self._broker, mail)
            await self._view.moves.done(mail)
            log.warning("a mail whose move was cut went back to its source: its target was deleted",
                        extra={"queue": mail.queue, "target": moved.queue, "enqueue_id": str(mail.enqueue_id)})
            return False
        await land(self._view, self._broker, await self.placed(moved))
        pending.append((mail, admin_events.moved(mail, moved)))
        return True

    async def placed(self, q: model.QueuedMail) -> model.QueuedMail:
        """``q`` in a slice its queue still reads: a move completed long after it was journaled
        (browse_svc down for a while) would land behind browse start, where no Browse, count or
        healer reads it and a sweep may have taken the slice (its delivery skipped as swept)."""
        start = await self._state.browse_start(q.queue)
        return dataclasses.replace(q, slice_start=start) if start is not None and q.slice_start < start else q

    async def finish(self, pending: list[tuple[model.QueuedMail, Event]]) -> None:
        """Step 4 of the moves in ``pending``: their events in one record, then their journal
        entries removed (a crash before: the entries are completed, and recorded, again)."""
        await admin_events.record(self._events, [e for _, e in pending])
        for mail, _ in pending:
            await self._view.moves.done(mail)
        pending.clear()


#: Namespace of the enqueue ids a move or a redrive lands (uuid5 of source queue, source id, target).
LANDING = uuid.UUID("6d1c2f0e-4b6a-5f3e-9a57-1f1f0c4e2a11")


def landing_id(q: model.QueuedMail, target: str) -> uuid.UUID:
    """The enqueue id of ``q`` landed in ``target``: the same for every mover of that copy."""
    return uuid.uuid5(LANDING, f"{q.queue}/{q.enqueue_id}->{target}")


async def restore(view: View, broker: Broker, q: model.QueuedMail) -> None:
    """A mail marked gone to a queue it never reached: live again in its own queue, counted again,
    and published anew one generation up (a copy of its message still queued is superseded).
    Rescheduled (marked not published) before it is unmarked: cut after that, the completion run
    again finds it marked and restores it again; cut after the unmark and before its publish is
    recorded, it finds it live and not published, and publishes it (``Mover.complete``)."""
    now = model.utcnow()
    again = dataclasses.replace(q, generation=q.generation + 1)
    await view.mails.reschedule(again, unpublished=True)
    await view.mails.unmark(q.queue, q.enqueue_id, now)
    waiting = again.due() > now
    await view.mails.count(again, gone=-1, delayed=1 if waiting else 0, held=1 if waiting and is_held(again) else 0)
    await broker.publish(again, again.due() - now if waiting else dt.timedelta(0))
    await view.mails.published(again)


async def publish_again(view: View, broker: Broker, q: model.QueuedMail) -> None:
    """``q``'s message at its generation, due when its schedule says, then recorded published.
    If the cut call had published it after all, the mail has two messages of one generation: one
    more delivery at worst."""
    now = model.utcnow()
    await broker.publish(q, max(q.due() - now, dt.timedelta(0)))
    await view.mails.published(q)


def landed(q: model.QueuedMail) -> model.QueuedMail:
    """``q`` as ``land`` lands it: a mail with attempts keeps them in its schedule record
    (generation 1)."""
    return dataclasses.replace(q, generation=max(q.generation, 1)) if q.attempts or q.last_error else q


async def land(view: View, broker: Broker, q: model.QueuedMail) -> bool:
    """Store, count and publish a mail that arrives in its queue whole (a move's target copy, a
    redriven dead letter); False when another call landed it (two movers of one mail, a move
    completed again): that one counted and published it. The landing's schedule record (a
    lightweight transaction, ``View.land``) decides, so one enqueue id is counted once and
    published once; a landing whose publish is not recorded (cut between the two, or under way in
    another call) is published by whoever finds it so (``MailState.unpublished``)."""
    q = landed(q)
    await view.mails.store(q)
    found = await view.mails.land(q)
    if found is None:
        await view.mails.count(q, enqueued=1, delayed=1 if q.due() > model.utcnow() else 0)
        await publish_landed(view, broker, q)
        return True
    if found.unpublished and not found.deleted:
        # Landed by another call whose publish is not recorded: it may have died before it (its
        # journal entry is removed with this one's), so published here too (then, at worst, twice).
        await publish_landed(view, broker, q)
    return False


async def publish_landed(view: View, broker: Broker, q: model.QueuedMail) -> None:
    """The landed copy's message, then the record that it is published (a completion cut before
    that record publishes it again: one enqueue id twice, in that instant only)."""
    q, now = landed(q), model.utcnow()
    waiting = q.due() > now
    await broker.publish(q, q.due() - now if waiting else dt.timedelta(0))
    await view.mails.published(q)

"""Queue lifecycle: creating a queue sets up its view rows and its broker topology; deleting it
removes them (its content is left to the retention sweep)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

from services.app import admin_events, browse_start
from services.app.dead_letter_admin import journal, purge_one
from services.app.queue_state import QueueState
from services.app.quota_admin import QuotaAdmin
from services.domain import names, schedule, validation
from services.domain.errors import Aborted, FailedPrecondition, NotFound
from services.domain.model import QueuedMail, RetryPolicy, utcnow
from services.domain.slices import slice_start
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

log = logging.getLogger(__name__)

#: Why the mails and dead letters of a queue deleted with force are gone.
DROPPED = "queue deleted"


async def create_queue(view: View, broker: Broker, queue: str, policy: RetryPolicy | None = None,
                       events: EventLog | None = None) -> bool:
    """Create ``queue`` idempotently; True when it is new.

    Order: topology, then the retry policy (only while the queue does not exist yet), then
    browse/content start (``IF NOT EXISTS``), then QUEUE_CREATED is recorded (while the queue does
    not exist yet), then the queue row, so a queue is listed only once everything it needs exists.
    A crash half-way is healed by a retry. The event's id names the queue's incarnation (its browse
    start, kept by a retry, and when the name was last deleted): one id for a creation retried, a
    new one for a queue made again under a deleted one's name (its browse start may be the same).
    """
    validation.queue_name(queue)
    if policy is not None:
        schedule.validate(policy)
    exists = await view.queues.exists(queue)
    if not exists:  # a queue made before names were reserved is still created again (idempotent)
        validation.new_queue_name(queue)
        if await view.queues.exists(names.dead_letter_queue_name(queue)):
            raise FailedPrecondition(
                f"a queue named {names.dead_letter_queue_name(queue)!r} exists: its exchange is the one {queue!r} would "
                "dead-letter to; delete it first or pick another name")
    await broker.declare_queue(queue)
    if policy is not None and not exists:
        await view.retry_policies.set(queue, policy)
    config = await view.config.current()
    await view.starts.initialise(queue, slice_start(utcnow(), config.slice_window))
    if not exists:
        await admin_events.record(events, [admin_events.queue_created(queue, await incarnation(view, queue))])
    return await view.queues.create(queue)


async def _incarnation(view: View, queue: str) -> str:
    start = await view.starts.browse_start(queue)
    return start.isoformat() if start is not None else ""


async def incarnation(view: View, queue: str) -> str:
    """Which queue of that name this is: its browse start, and when the name was last deleted (a
    name made again after a DeleteQueue is another incarnation; its browse start may be the same)."""
    dropped = await view.queues.dropped_at(queue)
    return await _incarnation(view, queue) + (f"|after {dropped.isoformat()}" if dropped else "")


@dataclasses.dataclass
class DropProgress:
    """A running DeleteQueue: ``phase`` is stopping (new mail refused everywhere), deleting
    (``force``: live mails marked deleted), removing (RabbitMQ topology, configuration) or done."""

    phase: str
    deleted: int = 0
    done: bool = False
    dead_letters_purged: int = 0


async def drop_queue(
    view: View, broker: Broker, state: QueueState, live_mails: Callable[[str], AsyncIterator[QueuedMail]],
    queue: str, force: bool = False, every: int = 100, events: EventLog | None = None,
) -> AsyncIterator[DropProgress]:
    """Delete ``queue``: refused while it holds live mails or dead letters unless ``force`` (the
    mails are marked deleted, the dead letters purged, so a queue made again under the name starts
    empty); its RabbitMQ queues and exchanges, retry policy, queue throttles, rules and quota
    removed; its
    content left to the retention sweep (the queue stays known to it as dropped).

    Order: the queue stops being listed and accepting mail, then this waits ``state.ttl_s``
    (every replica's cache of the queue has expired: no Enqueue still in flight can publish to
    it afterwards), then checks again for live mails (an Enqueue that raced the check), and only
    then removes the topology. Interrupted, a retry completes it; once complete (recorded), the
    name is NOT_FOUND to DeleteQueue, as a name never used.

    Recorded: QUEUE_DELETED once the deletion can no longer be refused (after the second check),
    its id naming the queue's incarnation as the call found it (as QUEUE_CREATED's: a retry of an
    interrupted deletion writes the same id); with ``force``, each live mail DELETED and each dead
    letter PURGED (reason "queue deleted"), in batches, before each change.
    """
    validation.queue_name(queue)
    if not await view.queues.exists(queue):
        if not await view.queues.dropped(queue):
            raise NotFound(f"queue {queue!r} does not exist")
        deleted_at = await view.queues.deleted_at(queue)
        if deleted_at is not None:  # not an interrupted deletion: nothing left to do, nothing recorded again
            raise NotFound(f"queue {queue!r} does not exist: it was deleted at {deleted_at.isoformat(timespec='seconds')}")
    if not force:
        try:
            await _refuse_if_live(live_mails, queue)
            await _refuse_if_dead_letters(view, queue)
        except FailedPrecondition:
            if not await view.queues.exists(queue):  # an earlier call, interrupted in its wait, left it unlisted
                await view.queues.restore(queue)
            raise
    redriving = await view.moves.pending(journal(queue))  # its dead letters' redrive journal
    if redriving:
        raise FailedPrecondition(f"queue {queue!r} has {len(redriving)} dead letter(s) in an interrupted redrive that "
                                 "could not be completed: retry DeleteQueue (it completes them first)")
    incarnation = await _incarnation(view, queue)
    await view.queues.drop(queue)
    state.forget_queue(queue)
    yield DropProgress("stopping")
    await asyncio.sleep(state.ttl_s)  # not polling: the other replicas' caches expire by the clock
    if await view.queues.exists(queue):
        raise Aborted(f"queue {queue!r} was created again while it was being deleted: the new queue is kept, nothing of "
                      "it removed (delete it again if that is what you want)")
    if not force:
        try:
            await _refuse_if_live(live_mails, queue)
        except FailedPrecondition:
            await view.queues.restore(queue)
            raise
    await admin_events.record(events, [admin_events.queue_deleted(queue, incarnation, force)])
    p = DropProgress("deleting")

    async def mark(q: QueuedMail) -> bool:
        await view.mails.mark_gone(q, DROPPED)
        return True

    deletes, seen = admin_events.RecordedFirst(events, mark), 0
    async for q in live_mails(queue):
        p.deleted += await deletes.add(q, admin_events.deleted(q, reason=DROPPED))
        seen += 1
        if seen % every == 0:
            yield dataclasses.replace(p)
    p.deleted += await deletes.flush()
    purges, seen = admin_events.RecordedFirst(events, lambda m: purge_one(view, m)), 0
    async for d in view.dead_letters.scan(queue):
        p.dead_letters_purged += await purges.add(d.mail, admin_events.purged(d.mail, reason=DROPPED))
        seen += 1
        if seen % every == 0:
            yield dataclasses.replace(p)
    p.dead_letters_purged += await purges.flush()
    p.phase = "removing"
    yield dataclasses.replace(p)
    await broker.delete_queue(queue)
    await view.retry_policies.delete(queue)
    for t in (await view.shaping.snapshot()).throttles:
        if t.queue == queue:
            await view.shaping.clear_throttle(queue, t.destination)
    # Its rules and its quota go with it (each recorded): a queue made again under the name starts
    # with none, as it starts empty (a bounce rule left behind would bounce its new mail).
    for rule in await view.rules.all():
        if rule.queue == queue:
            await admin_events.record(events, [admin_events.rule_changed(rule, "removed")])
            await view.rules.lift(rule.rule_id)
    await QuotaAdmin(view.quotas, state, events).clear_quota("queue", queue)
    # Every mail of it is gone: its browse start moves on, so the retention sweep can drop its
    # slices (the healer keeps moving it for the slices still too recent now).
    await browse_start.update(view, queue)
    await view.queues.drop_done(queue)  # a DeleteQueue of the name from now on: NOT_FOUND
    log.warning("queue deleted", extra={"queue": queue, "force": force, "mails_deleted": p.deleted,
                                        "dead_letters_purged": p.dead_letters_purged})
    yield DropProgress("done", p.deleted, True, p.dead_letters_purged)


async def _refuse_if_live(live_mails: Callable[[str], AsyncIterator[QueuedMail]], queue: str) -> None:
    async for _ in live_mails(queue):
        raise FailedPrecondition(
            f"queue {queue!r} holds live mails: deliver, move or delete them first (mailq clear {queue} --force), "
            f"or delete the queue with force (mailq drop {queue} --force) to delete them with it")


async def _refuse_if_dead_letters(view: View, queue: str) -> None:
    async for _ in view.dead_letters.scan(queue):
        raise FailedPrecondition(
            f"queue {queue!r} holds dead letters: redrive or purge them first (mailq dead purge {queue} --all), "
            f"or delete the queue with force (mailq drop {queue} --force) to purge them with it")

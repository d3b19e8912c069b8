"""The admin operations of browse_svc (AdminService): queues, deletes, flushes, republishing,
counters, browse start, the view configuration, retry policies and operator rules. The read side
is services/app/browser.py; delete and clear mark mails deleted (RabbitMQ is not purged: dequeue
skips them) and only touch mails that existed when the call started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from services.app import admin_events, browse_start, queues
from services.app.browser import Browser
from services.app.moves import MoveProgress, Mover
from services.app.queue_state import QueueState
from services.app.queues import DropProgress, create_queue, drop_queue
from services.domain import counts, model, rules, schedule, validation, view_config
from services.domain.errors import Aborted, InvalidArgument, NotFound
from services.domain.events import EventType
from services.domain.filters import BrowseFilter
from services.domain.model import truncated
from services.ports.broker import Broker
from services.ports.events import EventLog
from services.ports.view import View

#: The lease one view configuration change holds (leases_v1), its TTL if its holder dies, and how
#: long a call waits for it before it is ABORTED (retry).
CONFIG_LEASE = "view-configuration-change"
CONFIG_LEASE_TTL_S = 10
CONFIG_LEASE_WAIT_S = 15.0


@dataclasses.dataclass
class Progress:
    scanned: int = 0
    deleted: int = 0
    done: bool = False


class Admin:
    def __init__(self, view: View, broker: Broker, state: QueueState, browser: Browser, events: EventLog | None = None) -> None:
        self._view = view
        self._broker = broker
        self._state = state
        self._browser = browser
        #: Where every change is recorded, with its actor (services/app/admin_events.py).
        self._events = events
        self.live_mails = browser.live_mails
        self.mover = Mover(view, broker, state, browser.candidates, events)
        #: Completes a queue's interrupted redrives (DeadLetterAdmin.complete_interrupted), set where
        #: both are built (browse_svc/app.py): DeleteQueue runs it first.
        self.complete_redrives: Callable[[str, dt.timedelta], Awaitable[int]] | None = None

    async def create_queue(self, queue: str, policy: model.RetryPolicy | None = None) -> bool:
        return await create_queue(self._view, self._broker, queue, policy, self._events)

    def move(self, queue: str, target: str, f: BrowseFilter, limit: int = 0) -> AsyncIterator[MoveProgress]:
        return self.mover.move(queue, target, f, limit)

    async def drop_queue(self, queue: str, force: bool) -> AsyncIterator[DropProgress]:
        """DeleteQueue (services/app/queues.py ``drop_queue``), once the moves out of the queue (and
        the redrives of its dead letters) that an interrupted MoveMails (RedriveDeadLetters) left
        journaled are completed: such a mail is no longer live in the queue (a dead letter) and not
        yet in its target, and only the queue's journal (completed for queues that exist) lands it."""
        validation.queue_name(queue)
        if await self._view.queues.exists(queue):
            pending: list = []
            for mail, moved, _begun in await self._view.moves.pending(queue):
                await self.mover.complete(mail, moved, pending)
            await self.mover.finish(pending)
            if self.complete_redrives is not None:  # the same for its dead letters being redriven
                await self.complete_redrives(queue, dt.timedelta(0))
        async for p in drop_queue(self._view, self._broker, self._state, self.live_mails, queue, force, events=self._events):
            yield p

    async def flush(self, queue: str, f: BrowseFilter, lifted: model.Rule | None = None) -> int:
        """Make every delayed mail matching ``f`` deliverable now, in enqueue order.

        Each gets a new generation: recorded FLUSHED (RELEASED when ``lifted``, the hold rule being
        lifted, held it), in batches, then published to the work queue and rescheduled, so the
        copy still waiting in the delay ladder is skipped when it arrives (the mail is delivered once).
        """
        queue = await self._browser.existing(queue)
        f = dataclasses.replace(f, schedule="delayed", now=model.utcnow() + dt.timedelta(milliseconds=1))

        async def make_due(pair: tuple[model.QueuedMail, model.QueuedMail]) -> bool:
            q, flushed = pair
            await self._broker.publish(flushed)
            await self._view.mails.reschedule(flushed)
            await self._view.mails.count(q, delayed=-1, held=-1 if counts.is_held(q) else 0)
            return True

        batch = admin_events.RecordedFirst(self._events, make_due)
        count = 0
        async for q in self.live_mails(queue, "flush"):
            if not f.matches(q):
                continue
            flushed = dataclasses.replace(q, deliver_at=model.utcnow(), generation=q.generation + 1,
                                          held_by=counts.NOT_HELD if q.held_by is not None else None)
            count += await batch.add((q, flushed), admin_events.flushed(flushed, lifted))
        count += await batch.flush()
        await self._view.counter_buffer.flush()  # a GetSize here after the answer reflects it
        return count

    async def delete(self, queue: str, f: BrowseFilter, every: int = 100, cleared: bool = False) -> AsyncIterator[Progress]:
        """Mark deleted every live mail matching ``f`` that existed when the call started (by enqueue
        ids: the mails the index finds, whatever the queue's depth; an id that is no live mail of
        the queue deletes nothing). Each is recorded DELETED (``cleared``: CLEARED, ClearQueue),
        in batches, before it is marked (services/app/admin_events.py)."""
        queue = await self._browser.existing(queue)
        started = model.utcnow()
        p = Progress()

        async def mark(q: model.QueuedMail) -> bool:
            await self._view.mails.mark_gone(q, "deleted by admin")
            return True

        batch = admin_events.RecordedFirst(self._events, mark)
        async for q in self._browser.candidates(queue, f, "delete", until=started + dt.timedelta(milliseconds=1)):
            p.scanned += 1
            if f.matches(q):
                p.deleted += await batch.add(q, admin_events.deleted(q, cleared))
            if p.scanned % every == 0:
                yield dataclasses.replace(p)
        p.deleted += await batch.flush()
        await self._view.counter_buffer.flush()  # a GetSize here after the answer reflects it
        p.done = True
        yield p

    async def reconcile(self, queue: str) -> tuple[counts.Counts, counts.Counts]:
        """Rewrite the queue's counters from an exact pass; (before, after)."""
        queue = await self._browser.existing(queue)
        before = await self._view.mails.size(queue)
        start = await self._view.starts.browse_start(queue)
        if start is None:
            return before, before
        now = model.utcnow()
        live = [q async for q in self.live_mails(queue, "reconcile")]
        raw = await self._view.counters.read(queue, counts.KINDS, start)
        deltas = list(counts.exact_deltas(raw, live, start, now))
        if deltas:  # recorded first, as every operator change (none when they were exact)
            await admin_events.record(self._events, [admin_events.counters_reconciled(queue, deltas)])
        for s, kind, delta in deltas:
            await self._view.counters.add(queue, kind, s, delta)
        return before, await self._view.mails.size(queue)

    async def republish(self, queue: str, older_than: dt.timedelta) -> int:
        """Publish again every live mail enqueued before ``now - older_than`` (heals a lossy broker),
        each recorded REPUBLISHED (the caller as actor), in batches, before it is published."""
        if older_than < dt.timedelta(0):
            raise InvalidArgument("older_than must not be negative")
        queue = await self._browser.existing(queue)
        cutoff = model.utcnow() - older_than

        async def publish(q: model.QueuedMail) -> bool:
            await self._broker.publish(q, max(q.due() - model.utcnow(), dt.timedelta(0)))
            return True

        batch = admin_events.RecordedFirst(self._events, publish)
        count = 0
        # Every slice: a mail moved or redriven keeping its attempts keeps its enqueue time in a
        # recent slice, which a scan ending at the cutoff's slice never reached.
        async for q in self.live_mails(queue, "republish"):
            if q.enqueued_at < cutoff:
                count += await batch.add(q, admin_events.republished_by_caller(q))
        return count + await batch.flush()

    async def update_browse_start(self, queue: str) -> dt.datetime | None:
        """Move the queue's browse start on (recorded BROWSE_START_MOVED first, when it moves)."""
        async def moving(before: dt.datetime, after: dt.datetime) -> None:
            await admin_events.record(self._events, [admin_events.browse_start_moved(queue, before, after)])

        queue = await self._browser.existing(queue)
        return await browse_start.update(self._view, queue, moving=moving)

    async def configuration(self) -> model.ViewConfig:
        return await self._view.config.current()

    async def update_configuration(self, wanted: model.ViewConfig) -> model.ViewConfig:
        """Apply a configuration change (services/domain/view_config.py says which are allowed);
        a change is recorded CONFIG_CHANGED (install-level: queue "") once it is known to be allowed
        and before it is stored."""
        async def record(before: model.ViewConfig, number: int) -> None:  # the change from ``before`` is allowed
            event = admin_events.changed(EventType.CONFIG_CHANGED, "", _view_settings(before), _view_settings(wanted),
                                         version=str(number))
            if event is not None:
                await admin_events.record(self._events, [event])

        view_config.check_change(await self._view.config.current(), wanted)  # refused at once: nothing recorded
        # One change at a time (a lease): the change checked, recorded and written is the one made.
        # Without it, calls at once each passed the check against the configuration they read,
        # recorded their change, and all but one then lost the write (and were refused).
        holder, deadline = uuid.uuid4().hex, time.monotonic() + CONFIG_LEASE_WAIT_S
        while not await self._view.leases.hold(CONFIG_LEASE, holder, CONFIG_LEASE_TTL_S):
            if time.monotonic() > deadline:
                raise Aborted("the view configuration is being changed by another call: retry")
            await asyncio.sleep(0.05)
        try:
            config = await self._view.config.apply(wanted, record)  # checked against the configuration it replaces
        finally:
            await self._view.leases.release(CONFIG_LEASE, holder)
        self._state.forget_config()
        return config

    async def update_retry_policy(self, queue: str, change: Callable[[model.RetryPolicy], model.RetryPolicy]) -> model.RetryPolicy:
        """The queue's retry policy changed by ``change`` (given the current one), validated, recorded
        CONFIG_CHANGED (details: the settings changed, ``setting`` "retry_policy") and stored."""
        queue = await self._browser.existing(queue)
        before = await self._view.retry_policies.get(queue)
        policy = schedule.validate(change(before))
        # The version: the policy's write time, or (the defaults) the queue's incarnation.
        version = await self._view.retry_policies.written(queue) or await queues.incarnation(self._view, queue)
        event = admin_events.changed(EventType.CONFIG_CHANGED, queue, _policy_settings(before), _policy_settings(policy),
                                     version=str(version), setting="retry_policy")
        if event is not None:
            await admin_events.record(self._events, [event])
        await self._view.retry_policies.set(queue, policy)
        self._state.forget_retry_policy(queue)
        return policy

    async def rules(self) -> list[model.Rule]:
        return await self._view.rules.all()

    async def add_rule(self, rule: model.Rule) -> tuple[model.Rule, int]:
        """Store the rule (recorded RULE_CHANGED "added"); a bounce rule also marks the queued mails
        it matches, each recorded BOUNCED as the caller's act, in batches. (rule, mails marked)."""
        now = model.utcnow()
        rule = rules.validate(dataclasses.replace(rule, rule_id=uuid.uuid4(), created_at=now), now)
        if rule.queue and not await self._view.queues.exists(rule.queue):
            raise NotFound(f"queue {rule.queue!r} does not exist: create it with AdminService.CreateQueue")
        await admin_events.record(self._events, [admin_events.rule_changed(rule, "added")])
        await self._view.rules.add(rule)
        applied = 0
        if rule.kind == "bounce":
            reason = truncated(rules.bounce_reason(rule))

            async def bounce(q: model.QueuedMail) -> bool:
                await self._view.mails.mark_gone(q, reason)
                return True

            batch = admin_events.RecordedFirst(self._events, bounce)
            for queue in [rule.queue] if rule.queue else await self._view.queues.all():
                async for q in self.live_mails(queue, "rule"):
                    if rules.matches(rule, q):
                        applied += await batch.add(q, admin_events.bounced_by(q, rule, reason))
            applied += await batch.flush()
        return rule, applied

    async def lift_rule(self, rule_id: uuid.UUID) -> int:
        """End the rule now (recorded RULE_CHANGED "removed"); a hold rule's held mails become
        deliverable, in enqueue order, each recorded RELEASED."""
        rule = await self._view.rules.get(rule_id)
        if rule is None:
            raise NotFound(f"rule {rule_id} does not exist or has expired (mailq rules lists the rules in force)")
        await admin_events.record(self._events, [admin_events.rule_changed(rule, "removed")])
        await self._view.rules.lift(rule_id)
        if rule.kind != "hold":
            return 0
        released = 0
        for queue in [rule.queue] if rule.queue else await self._view.queues.all():
            try:
                released += await self.flush(queue, BrowseFilter(held_by=rule_id), lifted=rule)
            except NotFound:  # deleted meanwhile, its mails with it: nothing of it to release
                continue
        return released


def _view_settings(c: model.ViewConfig) -> dict[str, str]:
    return {"slice_window_s": str(int(c.slice_window.total_seconds())), "bucket_count": str(c.bucket_count),
            "update_browse_start_pace": str(c.update_browse_start_pace)}


def _policy_settings(p: model.RetryPolicy) -> dict[str, str]:
    return {"initial_backoff_s": str(p.initial_backoff.total_seconds()), "multiplier": str(p.multiplier),
            "max_backoff_s": str(p.max_backoff.total_seconds()), "max_attempts": str(p.max_attempts),
            "max_age_s": str(p.max_age.total_seconds())}

"""The events of what operators and the queue's own components do (the audit trail): moves,
deletes, clears, purges, redrives, flushes, rules applied to queued mail (and lifted), republishes
(the healer's and RepublishNotProcessed's), and the queue- and install-level changes (queues,
configuration, retry policies, rules, shaping).

Ids (services/domain/events.py ``event_id``) are derived from the change only, never from when or
by whom it was made, so a change carried out again (a call retried after a lost answer, the
healer completing an interrupted move) writes the same id:

- a mail's admin event has step 0 and names its change in the discriminator (the target queue of a
  move or redrive, the rule of a bounce; a republish: the new generation as its step);
- a queue-level event names the queue's incarnation (its browse start when created) or the
  change itself (``before -> after`` of a setting and the version of the state it changed; a
  rule id and "added"/"removed").

Order (each use-case says which): a change with a journal (a move, a redrive) records its events
after the mail landed and before the journal entry is removed, so a crash in between leaves the
entry for the next call or the healer, which records them again (same ids). A change without a
journal (a delete, a purge, a queue or setting change) records first and then changes: a crash in
between leaves an event whose change the caller was never told was made; the caller's retry makes
it with the same id. Never a change without its event.

Bulk changes record in batches (``BATCH`` events a call to ``EventLog.record``), never one round
trip per mail. A call refused for bad input is refused before anything is recorded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

from services.domain import model
from services.domain.events import Actor, Event, EventType, of_mail, of_queue
from services.ports.events import EventLog

#: Events of one bulk operation recorded together (one EventLog.record).
BATCH = 500
#: The same for a journaled one (moves, redrives): the moves a SIGKILL leaves journaled, for the
#: next call or the healer to complete (publishing their target copies again) and record.
JOURNALED_BATCH = 100

HEALER = Actor.component("healer")

T = TypeVar("T")


async def record(log: EventLog | None, events: Sequence[Event]) -> None:
    """Record ``events`` (one call, whatever their number); nothing when there is none or no log
    (a use-case built without an event log: bench/, and a build before the event log is wired)."""
    if log is not None and events:
        await log.record(list(events))


class RecordedFirst(Generic[T]):
    """A bulk change without a journal, made ``BATCH`` items at a time: each batch's events are
    recorded in one call, then ``apply`` changes each item (True: it changed)."""

    def __init__(self, log: EventLog | None, apply: Callable[[T], Awaitable[bool]]) -> None:
        self._log = log
        self._apply = apply
        self._items: list[tuple[T, Event]] = []

    async def add(self, item: T, event: Event) -> int:
        """Queue one change; how many changed now (a full batch was made), else 0."""
        self._items.append((item, event))
        return await self.flush() if len(self._items) >= BATCH else 0

    async def flush(self) -> int:
        """Make the queued changes (their events first); how many changed."""
        items, self._items = self._items, []
        await record(self._log, [e for _, e in items])
        return sum([await self._apply(item) for item, _ in items])


def _landing(kind: EventType, mail: model.QueuedMail, landed: model.QueuedMail) -> Event:
    return of_mail(kind, mail, step=0, discriminator=f"to:{landed.queue}",
                   details={"to_queue": landed.queue, "to_enqueue_id": str(landed.enqueue_id)})


def moved(mail: model.QueuedMail, landed: model.QueuedMail) -> Event:
    """``mail`` moved (MoveMails, or its completion by the healer) and landed as ``landed``."""
    return _landing(EventType.MOVED, mail, landed)


def redriven(dead: model.QueuedMail, landed: model.QueuedMail) -> Event:
    """A dead letter of ``dead.queue`` redriven, landed as ``landed``."""
    return _landing(EventType.REDRIVEN, dead, landed)


def deleted(mail: model.QueuedMail, cleared: bool = False, reason: str = "") -> Event:
    """Deleted by DeleteMails (or by ClearQueue: CLEARED; by a forced DeleteQueue: the reason says so)."""
    return of_mail(EventType.CLEARED if cleared else EventType.DELETED, mail, step=0, reason=reason)


def purged(mail: model.QueuedMail, reason: str = "") -> Event:
    return of_mail(EventType.PURGED, mail, step=0, reason=reason)


def bounced_by(mail: model.QueuedMail, rule: model.Rule, reason: str) -> Event:
    """A new bounce rule applied to a queued mail by AddRule: the caller's act (the current actor)."""
    return of_mail(EventType.BOUNCED, mail, step=0, discriminator=str(rule.rule_id), reason=reason,
                   details={"rule_id": str(rule.rule_id)})


def republished(again: model.QueuedMail) -> Event:
    """The healer published again a mail whose message was lost (``again``: its new generation)."""
    return of_mail(EventType.REPUBLISHED, again, step=again.generation, actor=HEALER)


def republished_by_caller(mail: model.QueuedMail) -> Event:
    """An operator's RepublishNotProcessed published ``mail`` again (same generation: the copy
    dequeue meets second is skipped). One id per mail and generation: the call retried, or made
    again before the mail moved on, writes the same event."""
    return of_mail(EventType.REPUBLISHED, mail, step=mail.generation, discriminator="operator", details={"by": "operator"})


def flushed(again: model.QueuedMail, lifted: model.Rule | None = None) -> Event:
    """``again`` (the mail's new generation) made deliverable now: by Flush (FLUSHED), or by lifting
    the hold rule ``lifted`` (RELEASED). The new generation is the step: a Flush retried after a
    crash before the mail was rescheduled computes the same generation, so the same id."""
    if lifted is None:
        return of_mail(EventType.FLUSHED, again, step=again.generation)
    return of_mail(EventType.RELEASED, again, step=again.generation, discriminator=str(lifted.rule_id),
                   details={"rule_id": str(lifted.rule_id)})


def counters_reconciled(queue: str, deltas: Sequence[tuple[dt.datetime, str, int]]) -> Event:
    """ReconcileCounters' corrections (slice, kind, delta): its id names them, so the same
    correction retried is the same event."""
    totals: dict[str, int] = {}
    for _, kind, delta in deltas:
        totals[kind] = totals.get(kind, 0) + delta
    change = ";".join(f"{s.isoformat()}/{k}/{d}" for s, k, d in sorted(deltas))
    details = {"slices": str(len({s for s, _, _ in deltas})), **{k: f"{d:+d}" for k, d in sorted(totals.items())}}
    return of_queue(EventType.COUNTERS_RECONCILED, queue, hashlib.sha1(change.encode()).hexdigest(), details=details)


def dead_letter_counters_reconciled(queue: str, corrections: dict[str, int]) -> Event:
    """ReconcileCounters' corrections of the queue's dead-letter counters (kind -> delta)."""
    change = ";".join(f"dead_letters/{k}/{d}" for k, d in sorted(corrections.items()))
    return of_queue(EventType.COUNTERS_RECONCILED, queue, hashlib.sha1(change.encode()).hexdigest(),
                    details={f"dead_letters.{k}": f"{d:+d}" for k, d in sorted(corrections.items())})


def browse_start_moved(queue: str, before: dt.datetime, after: dt.datetime) -> Event:
    return of_queue(EventType.BROWSE_START_MOVED, queue, f"{before.isoformat()}>{after.isoformat()}",
                    details={"from": before.isoformat(), "to": after.isoformat()})


def queue_created(queue: str, incarnation: str) -> Event:
    return of_queue(EventType.QUEUE_CREATED, queue, incarnation)


def queue_deleted(queue: str, incarnation: str, force: bool) -> Event:
    return of_queue(EventType.QUEUE_DELETED, queue, incarnation, details={"force": str(force).lower()})


def changed(kind: EventType, queue: str, before: Mapping[str, str], after: Mapping[str, str], version: str = "",
            **details: str) -> Event | None:
    """A setting changed from ``before`` to ``after`` (None when nothing changed: no event). The
    details hold each changed setting's new value (and ``details``). ``version`` names the state
    changed (its write time, its sequence number): a value set back and forth makes a new id at
    each change, a change retried over the same state the same one."""
    diff = {k: v for k, v in after.items() if before.get(k) != v}
    diff.update({k: "" for k in before if k not in after})
    if not diff:
        return None
    change = "|".join([*([f"version={version}"] if version else []), *(f"{k}={v}" for k, v in sorted(details.items())),
                       *(f"{k}:{before.get(k, '')}->{after.get(k, '')}" for k in sorted(diff))])
    return of_queue(kind, queue, change, details={**diff, **details})


def rule_changed(rule: model.Rule, change: str) -> Event:
    """An operator rule ``added`` or ``removed`` (lifted)."""
    return of_queue(EventType.RULE_CHANGED, rule.queue, f"{rule.rule_id}/{change}",
                    details={"rule_id": str(rule.rule_id), "change": change, "kind": rule.kind})

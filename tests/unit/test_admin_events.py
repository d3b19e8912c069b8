"""The audit trail's pure parts (services/app/admin_events.py): stable ids, actors, details, and
bulk changes recorded in batches before they are made. The EventLog here is a recorder (a double
of the port, not of a backend); the events written through gRPC are tested with the event log."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

import pytest

from services.app import admin_events
from services.app.moves import landing_id
from services.domain import model
from services.domain.errors import BackendUnavailable
from services.domain.events import ANONYMOUS, Actor, Event, EventType, acting_as, current_actor

UTC = dt.timezone.utc
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    """Collects what is recorded, each call apart; ``log`` interleaves records and changes."""

    def __init__(self, log: list[str] | None = None, fail: bool = False) -> None:
        self.calls: list[list[Event]] = []
        self.log = log if log is not None else []
        self.fail = fail

    async def record(self, events: Sequence[Event]) -> None:
        if self.fail:
            raise BackendUnavailable("cassandra", "the history did not answer")
        self.calls.append(list(events))
        self.log.append(f"record {len(events)}")

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        return [e for c in self.calls for e in c if e.enqueue_id == enqueue_id]

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        return [e for c in self.calls for e in c if e.name == name][:limit]


def mail(queue: str = "spool", attempts: int = 0, traceparent: str = "") -> model.QueuedMail:
    t = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return model.QueuedMail(queue, uuid.uuid4(), t, model.Mail("m.eml", "a@b.c", ("d@e.f",)), ("a" * 64,), 10, t, 0,
                            attempts=attempts, traceparent=traceparent)


def test_a_move_names_where_the_mail_landed_and_the_same_move_completed_again_has_the_same_id():
    q = mail(traceparent=TRACE)
    landed = dataclasses.replace(q, queue="other", enqueue_id=landing_id(q, "other"))
    caller = Actor("caller", "admin", "token:0123456789ab")
    with acting_as(caller):
        first = admin_events.moved(q, landed)
    with acting_as(admin_events.HEALER):  # the healer completing the interrupted move
        again = admin_events.moved(dataclasses.replace(q, attempts=3), landed)  # read from the journal
    assert first.id == again.id and first.type is EventType.MOVED
    assert (first.actor, again.actor) == (caller, admin_events.HEALER)
    assert first.details == {"to_queue": "other", "to_enqueue_id": str(landing_id(q, "other"))}
    assert first.traceparent == TRACE  # the producer's trace, carried by the mail's events
    assert admin_events.moved(q, dataclasses.replace(landed, queue="third")).id != first.id
    assert admin_events.redriven(q, landed).id != first.id


def test_delete_clear_purge_and_bounce_are_told_apart_and_a_retried_one_has_the_same_id():
    q = mail()
    rule = model.Rule(uuid.uuid4(), "bounce", q.enqueued_at, q.enqueued_at + dt.timedelta(hours=1))
    events = [admin_events.deleted(q), admin_events.deleted(q, cleared=True), admin_events.purged(q),
              admin_events.bounced_by(q, rule, "bounced by rule")]
    assert [e.type for e in events] == [EventType.DELETED, EventType.CLEARED, EventType.PURGED, EventType.BOUNCED]
    assert len({e.id for e in events}) == 4
    assert admin_events.deleted(q).id == events[0].id
    assert events[3].details == {"rule_id": str(rule.rule_id)} and events[3].actor == current_actor.get() == ANONYMOUS


def test_a_republish_is_the_healers_and_each_generation_has_its_own_id():
    q = mail()
    one, two = (admin_events.republished(dataclasses.replace(q, generation=g)) for g in (1, 2))
    assert one.actor == Actor.component("healer") and one.id != two.id
    assert admin_events.republished(dataclasses.replace(q, generation=1)).id == one.id


def test_an_operators_republish_flush_and_release_are_the_callers_and_a_retried_one_has_the_same_id():
    q = mail()
    caller = Actor("caller", "admin", "token:0123456789ab")
    rule = model.Rule(uuid.uuid4(), "hold", q.enqueued_at, q.enqueued_at + dt.timedelta(hours=1))
    again = dataclasses.replace(q, generation=1)
    with acting_as(caller):
        events = [admin_events.republished_by_caller(q), admin_events.flushed(again), admin_events.flushed(again, rule)]
        retried = [admin_events.republished_by_caller(q), admin_events.flushed(again), admin_events.flushed(again, rule)]
    assert [e.type for e in events] == [EventType.REPUBLISHED, EventType.FLUSHED, EventType.RELEASED]
    assert [e.id for e in retried] == [e.id for e in events] and len({e.id for e in events}) == 3
    assert all(e.actor == caller for e in events) and events[2].details == {"rule_id": str(rule.rule_id)}
    assert events[0].id != admin_events.republished(q).id  # the healer's republish of that copy is another change
    assert admin_events.flushed(dataclasses.replace(q, generation=2)).id != events[1].id  # flushed again later


def test_a_setting_change_names_what_changed_and_no_change_is_no_event():
    before = {"max_attempts": "5", "multiplier": "2.0"}
    after = {"max_attempts": "8", "multiplier": "2.0"}
    e = admin_events.changed(EventType.CONFIG_CHANGED, "spool", before, after, setting="retry_policy")
    assert e is not None and e.details == {"max_attempts": "8", "setting": "retry_policy"} and e.enqueue_id is None
    assert admin_events.changed(EventType.CONFIG_CHANGED, "spool", before, after, setting="retry_policy").id == e.id
    assert admin_events.changed(EventType.CONFIG_CHANGED, "other", before, after, setting="retry_policy").id != e.id
    assert admin_events.changed(EventType.CONFIG_CHANGED, "spool", before, dict(before)) is None
    # The same settings on two destinations: two changes.
    a = admin_events.changed(EventType.SHAPING_CHANGED, "", {}, {"rate": "10"}, destination="a.com", change="set")
    b = admin_events.changed(EventType.SHAPING_CHANGED, "", {}, {"rate": "10"}, destination="b.com", change="set")
    assert a is not None and b is not None and a.id != b.id
    # Set back to what it was (A to B, B to A, A to B): the state it changed is another version.
    again = admin_events.changed(EventType.CONFIG_CHANGED, "spool", before, after, version="2", setting="retry_policy")
    retried = admin_events.changed(EventType.CONFIG_CHANGED, "spool", before, after, version="2", setting="retry_policy")
    assert again is not None and retried is not None and again.id != e.id and retried.id == again.id
    assert again.details == e.details
    removed = admin_events.changed(EventType.SHAPING_CHANGED, "", {"rate": "10"}, {}, destination="a.com", change="removed")
    assert removed is not None and removed.details == {"rate": "", "destination": "a.com", "change": "removed"}


def test_a_rule_added_and_removed_are_two_changes():
    rule = model.Rule(uuid.uuid4(), "hold", dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2026, 1, 2, tzinfo=UTC), queue="q")
    added, removed = admin_events.rule_changed(rule, "added"), admin_events.rule_changed(rule, "removed")
    assert added.id != removed.id and added.queue == "q"
    assert removed.details == {"rule_id": str(rule.rule_id), "change": "removed", "kind": "hold"}


def test_a_bulk_change_records_a_batch_in_one_call_before_changing_it():
    log: list[str] = []
    recorder = Recorder(log)
    changed: list[model.QueuedMail] = []

    async def apply(q: model.QueuedMail) -> bool:
        log.append("change")
        changed.append(q)
        return True

    async def run() -> int:
        batch = admin_events.RecordedFirst(recorder, apply)
        n = 0
        for q in mails:
            n += await batch.add(q, admin_events.deleted(q))
        return n + await batch.flush()

    n = admin_events.BATCH * 2 + 7
    mails = [mail() for _ in range(n)]
    assert asyncio.run(run()) == n and changed == mails
    assert [len(c) for c in recorder.calls] == [admin_events.BATCH, admin_events.BATCH, 7]
    # Each batch's events are recorded before any of its changes is made.
    assert log[0] == f"record {admin_events.BATCH}" and log[admin_events.BATCH + 1] == f"record {admin_events.BATCH}"
    assert [e.enqueue_id for c in recorder.calls for e in c] == [q.enqueue_id for q in mails]


def test_a_batch_whose_events_cannot_be_recorded_is_not_changed():
    changed: list[model.QueuedMail] = []

    async def apply(q: model.QueuedMail) -> bool:
        changed.append(q)
        return True

    async def run() -> None:
        batch = admin_events.RecordedFirst(Recorder(fail=True), apply)
        q = mail()
        await batch.add(q, admin_events.deleted(q))
        await batch.flush()

    with pytest.raises(BackendUnavailable):
        asyncio.run(run())
    assert changed == []


def test_no_event_log_records_nothing_and_no_events_make_no_call():
    recorder = Recorder()
    asyncio.run(admin_events.record(recorder, []))
    asyncio.run(admin_events.record(None, [admin_events.deleted(mail())]))
    assert recorder.calls == []

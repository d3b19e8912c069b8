"""Cursors and filters of the event stream (services/domain/event_stream.py): pure logic."""

from __future__ import annotations

import dataclasses

import pytest

from services.domain import event_stream
from services.domain.errors import InvalidArgument
from services.domain.event_stream import FIRST, INDEX_BITS, MAX_PER_MESSAGE, NEXT, EventFilter, Start, cursor_of, start
from services.domain.events import ANONYMOUS, EventType, of_queue


def test_where_a_watch_starts():
    assert start("", from_oldest=False) == Start(NEXT)
    assert start("", from_oldest=True) == Start(FIRST)
    assert start("0") == Start(0, 0)
    assert start(cursor_of(42, 7), from_oldest=True) == Start(42, 7)  # a cursor wins over from_oldest
    assert start(str(2**63 - 1)) == Start(2**(63 - INDEX_BITS) - 1, 2**INDEX_BITS - 1)
    # The place just before an event (its cursor minus one, as a webhook endpoint saves it): after
    # every event of the message before, so that event first.
    before = start(str(int(cursor_of(5, 0)) - 1))
    assert before == Start(4, 2**INDEX_BITS - 1) and before.wants(5, 0) and not before.wants(4, MAX_PER_MESSAGE - 1)


def test_a_cursor_names_a_message_and_a_place_in_it_and_grows_with_both():
    cursors = [int(cursor_of(offset, index)) for offset in (0, 1, 5, 2**40) for index in (0, 1, MAX_PER_MESSAGE - 1)]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    with pytest.raises(ValueError):
        cursor_of(3, 2**INDEX_BITS)
    begin = start(cursor_of(10, 3))
    assert [begin.wants(o, i) for o, i in ((9, 900), (10, 2), (10, 3), (10, 4), (11, 0))] == [False, False, True, True, True]
    assert Start(FIRST).wants(0, 0) and Start(NEXT).wants(7, 1)


@pytest.mark.parametrize("cursor", ["abc", "-1", "+1", "1.5", " 7", "7 ", "١٢", str(2**63), "9" * 40, "first", "next"])
def test_a_malformed_cursor_is_invalid(cursor):
    with pytest.raises(InvalidArgument, match="is not a cursor of this stream"):
        start(cursor)


def test_a_filter_keeps_the_queues_and_types_asked_for():
    e = of_queue(EventType.QUEUE_CREATED, "q1", "v1", actor=ANONYMOUS)
    assert EventFilter.of()(e)
    assert EventFilter.of(["q1", "q2"], [EventType.QUEUE_CREATED])(e)
    assert not EventFilter.of(["q2"])(e)
    assert not EventFilter.of([], [EventType.ENQUEUED])(e)


def test_an_event_survives_the_stream_format_with_its_cursor():
    import datetime as dt
    import uuid

    from services.contract.events_serde import event_from_bytes, event_to_bytes
    from services.domain.events import Actor, Event

    e = Event(id="i", time=dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc), type=EventType.RETRY_SCHEDULED,
              queue="q", enqueue_id=uuid.uuid4(), actor=Actor("caller", "consumer", "token:abc"), name="n", sender="s@x",
              attempt=3, reason="451", replica="h/dequeue", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
              details={"next_attempt_at": "2026-01-02T03:05:00Z"})
    assert event_from_bytes(event_to_bytes(e), "17") == dataclasses.replace(e, cursor="17")
    queue_level = dataclasses.replace(e, enqueue_id=None, actor=Actor.component("healer"))
    assert event_from_bytes(event_to_bytes(queue_level)) == queue_level


def test_events_recorded_together_leave_as_messages_of_bounded_count_and_size_in_order():
    import datetime as dt

    from services.adapters.rabbitmq.event_stream import MESSAGE_BYTES, _cut
    from services.contract.events_serde import batch_from_bytes, batch_to_bytes, encode_each, event_from_proto
    from services.domain.events import Event

    def event(i: int, reason: str = "") -> Event:
        return Event(id=f"e{i}", time=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), type=EventType.DELIVERED,
                     queue="q", enqueue_id=None, actor=ANONYMOUS, reason=reason)

    small = [event(i) for i in range(2500)]
    parts = [small[first:end] for first, end in _cut(encode_each(small))]
    assert [len(p) for p in parts] == [MAX_PER_MESSAGE, MAX_PER_MESSAGE, 500]
    assert [e.id for p in parts for e in p] == [e.id for e in small]
    large = [event(i, "x" * 100_000) for i in range(7)]
    assert _cut(encode_each(large)) == [(0, 5), (5, 7)]  # about MESSAGE_BYTES each
    assert all(len(batch_to_bytes(large[first:end])) <= MESSAGE_BYTES for first, end in _cut(encode_each(large)))
    assert _cut([]) == [] and _cut(encode_each(large[:1])) == [(0, 1)]
    body = batch_to_bytes(small[:3])
    assert [event_from_proto(pb, str(i)) for i, pb in enumerate(batch_from_bytes(body))] == \
        [dataclasses.replace(e, cursor=str(i)) for i, e in enumerate(small[:3])]


def test_messages_missed_between_a_checkpoint_and_the_first_event_read():
    c = event_stream.cursor_of
    assert event_stream.messages_missed(c(10, 3), c(10, 4)) == 0  # the same message, next event
    assert event_stream.messages_missed(c(10, 55), c(11, 0)) == 0  # the checkpoint was its message's last event
    assert event_stream.messages_missed(str(int(c(10)) - 1), c(10, 0)) == 0  # "before the first": the message before, index 65535
    assert event_stream.messages_missed(c(10, 3), c(14, 0)) == 3  # messages 11, 12, 13 removed by the retention

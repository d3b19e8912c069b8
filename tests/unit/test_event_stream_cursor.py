"""Cursors and filters of the event stream (services/domain/event_stream.py): pure logic."""

from __future__ import annotations

import pytest

from services.domain.errors import InvalidArgument
from services.domain.event_stream import FIRST, NEXT, EventFilter, start
from services.domain.events import ANONYMOUS, EventType, of_queue


def test_where_a_watch_starts():
    assert start("", from_oldest=False) == NEXT
    assert start("", from_oldest=True) == FIRST
    assert start("0") == 0 and start("42", from_oldest=True) == 42  # a cursor wins over from_oldest
    assert start(str(2**63 - 1)) == 2**63 - 1


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
    assert event_from_bytes(event_to_bytes(e), "17") == Event(**{**e.__dict__, "cursor": "17"})
    queue_level = Event(**{**e.__dict__, "enqueue_id": None, "actor": Actor.component("healer")})
    assert event_from_bytes(event_to_bytes(queue_level)) == queue_level

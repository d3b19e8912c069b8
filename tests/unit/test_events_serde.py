"""Events: protobuf <-> domain round trips, the history's order, GetMailHistory's request rules."""

import dataclasses
import datetime as dt
import uuid

import pytest

from mailqueue.v1 import events_pb2
from services.contract import events_serde as s
from services.domain.errors import InvalidArgument
from services.domain.events import Actor, Event, EventType, ordered

AT = dt.datetime(2026, 11, 27, 10, 0, 0, 123000, tzinfo=dt.timezone.utc)


def event(kind=EventType.RETRY_SCHEDULED, at=AT, attempt=1, **kw) -> Event:
    fields = dict(id=str(uuid.uuid4()), time=at, type=kind, queue="q", enqueue_id=uuid.uuid4(),
                  actor=Actor("caller", "consumer", "token:0123456789ab"), name="n", sender="a@example.com",
                  attempt=attempt, reason="451 later", replica="h/dequeue", traceparent="00-abc-def-01",
                  details={"next_attempt_at": "2026-11-27T10:01:00+00:00"}, cursor="")
    fields.update(kw)
    return Event(**fields)


@pytest.mark.parametrize("kind", list(EventType))
def test_every_field_and_type_round_trips(kind):
    e = event(kind)
    assert s.event_from_proto(s.event_to_proto(e)) == e


def test_a_component_and_a_queue_level_event_round_trip():
    e = event(EventType.QUEUE_CREATED, enqueue_id=None, actor=Actor.component("healer"), details={})
    assert s.event_from_proto(s.event_to_proto(e)) == e


def test_events_of_one_millisecond_keep_the_order_a_mail_lives_them():
    handed, enq, answered = event(EventType.HANDED_OUT), event(EventType.ENQUEUED, attempt=0), event(EventType.DELIVERED)
    later = event(EventType.HANDED_OUT, at=AT + dt.timedelta(milliseconds=1), attempt=2)
    assert ordered([later, answered, handed, enq]) == [enq, handed, answered, later]


def test_a_history_request_names_one_mail_or_one_name():
    i = uuid.uuid4()
    assert s.history_request_from_proto(events_pb2.GetMailHistoryRequest(enqueue_id=str(i))) == (i, None)
    assert s.history_request_from_proto(events_pb2.GetMailHistoryRequest(name="n")) == (None, "n")
    for bad in (events_pb2.GetMailHistoryRequest(), events_pb2.GetMailHistoryRequest(name=""),
                events_pb2.GetMailHistoryRequest(enqueue_id="12ab")):
        with pytest.raises(InvalidArgument):
            s.history_request_from_proto(bad)


class Partitions:
    """An EventLog read side holding each mail's events (a double of the port, not of Cassandra)."""

    def __init__(self, events: list[Event]) -> None:
        self.events, self.reads = events, 0

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        self.reads += 1
        return [e for e in self.events if e.enqueue_id == enqueue_id]


def test_a_history_by_id_follows_the_moves_and_redrives_a_partition_read_each():
    import asyncio

    from services.app.history import History

    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    caller = Actor("caller", "admin", "anonymous")
    at = lambda n: AT + dt.timedelta(seconds=n)  # noqa: E731
    events = [Event(str(uuid.uuid4()), at(0), EventType.ENQUEUED, "q", a, caller),
              Event(str(uuid.uuid4()), at(1), EventType.MOVED, "q", a, caller, details={"to_enqueue_id": str(b)}),
              Event(str(uuid.uuid4()), at(2), EventType.REDRIVEN, "r", b, caller, details={"to_enqueue_id": str(c)}),
              Event(str(uuid.uuid4()), at(3), EventType.DELIVERED, "q", c, caller),
              Event(str(uuid.uuid4()), at(4), EventType.MOVED, "q", c, caller, details={"to_enqueue_id": str(a)})]  # a loop
    log = Partitions(events)
    story = asyncio.run(History(log).of(a, None))  # type: ignore[arg-type]
    assert [e.id for e in story] == [e.id for e in events] and log.reads == 3
    looped = Partitions(events)  # from c, the loop back to a: each partition read once
    assert len(asyncio.run(History(looped).of(c, None))) == 5 and looped.reads == 3  # type: ignore[arg-type]


def test_a_batch_joined_from_encoded_events_is_the_batch_protobuf_writes():
    # Given events, one of them over 127 bytes of text (a two-byte length on the wire), one naming no replica
    events = [event(), event(reason="x" * 300), event(replica="")]
    # When each is encoded once and the batch joined from those bytes
    joined = s.batch_of_encoded(s.encode_each(events, replica="h/enqueue"))
    # Then it is byte for byte the EventBatch protobuf serializes, and the replica is filled in where none was named
    expected = events_pb2.EventBatch(events=[s.event_to_proto(e) for e in events])
    expected.events[2].replica = "h/enqueue"
    assert joined == expected.SerializeToString()
    assert [s.event_from_proto(pb).replica for pb in s.batch_from_bytes(joined)] == ["h/dequeue", "h/dequeue", "h/enqueue"]
    assert s.batch_of_encoded([]) == b""


@pytest.mark.parametrize("e", [
    *(event(kind) for kind in EventType),
    event(EventType.QUEUE_CREATED, enqueue_id=None, actor=Actor.component("healer"), details={}, name="", sender="",
          attempt=0, reason="", traceparent="", replica=""),
    event(cursor="1:0", at=dt.datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc)),
], ids=lambda e: e.type.value)
def test_each_event_encodes_to_the_bytes_of_its_message(e):
    # encode_each builds its messages from tables and leaves out empty fields: the same bytes as event_to_proto's
    assert s.encode_each([e]) == [s.event_to_proto(e).SerializeToString()]
    assert s.event_from_bytes(s.encode_each([e])[0], e.cursor) == e


@pytest.mark.parametrize("e", [
    event(details={"a": ""}),
    event(details={"": "b"}),
    event(at=dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=dt.timezone.utc)),
    event(at=dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), attempt=300, reason="é" * 200, name="ñ", cursor="9" * 130),
    event(actor=Actor("caller", "", ""), sender="", traceparent="", replica=""),
], ids=["empty-map-value", "empty-map-key", "before-1970", "long-and-unicode", "empty-actor"])
def test_edge_events_encode_to_the_bytes_of_their_message(e):
    # Negative seconds are a 10-byte varint; a map entry writes its key and value even when empty;
    # lengths over 127 take two bytes: the same bytes as protobuf's own serialization
    assert s.encode_each([e]) == [s.event_to_proto(e).SerializeToString()]


def test_a_mails_events_encoded_together_share_what_they_share_and_nothing_else():
    # Given a delivery's two events of one mail, then an event of another mail by another actor
    first = event(EventType.HANDED_OUT, details={}, reason="")
    second = dataclasses.replace(first, id=str(uuid.uuid4()), type=EventType.DELIVERED, time=AT + dt.timedelta(seconds=1))
    other = event(EventType.DELIVERED, actor=Actor.component("healer"), replica="", traceparent="")
    several = event(details={"b": "1", "a": "2", "c": "3"})
    # When they are encoded in one call
    encoded = s.encode_each([first, second, other, several], replica="h/x")
    # Then each is the message protobuf makes of it alone (the map's entries in any order)
    assert encoded[:3] == [s.encode_each([e], replica="h/x")[0] for e in (first, second, other)]
    assert encoded[2] == s.event_to_proto(dataclasses.replace(other, replica="h/x")).SerializeToString()
    assert [s.event_from_bytes(b) for b in encoded] == [first, second, dataclasses.replace(other, replica="h/x"), several]

"""Events: protobuf <-> domain round trips, the history's order, GetMailHistory's request rules."""

import datetime as dt
import uuid

import pytest

from mailqueue.v1 import events_pb2
from services.adapters.cassandra.event_log import ordered
from services.contract import events_serde as s
from services.domain.errors import InvalidArgument
from services.domain.events import Actor, Event, EventType

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

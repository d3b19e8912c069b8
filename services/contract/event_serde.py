"""Event <-> protobuf (protos/mailqueue/v1/events.proto): what the event stream carries (the
message body is the serialized Event) and what EventService answers."""

from __future__ import annotations

import datetime as dt
import uuid

from mailqueue.v1 import events_pb2
from services.contract.serde import timestamp_to_proto
from services.domain.errors import InvalidArgument
from services.domain.events import Actor, Event, EventType

_UTC = dt.timezone.utc


def event_type_to_proto(kind: EventType) -> int:
    return events_pb2.EventType.Value("EVENT_TYPE_" + kind.value.upper())


def event_type_from_proto(value: int) -> EventType:
    """A client's EventType; INVALID_ARGUMENT for UNSPECIFIED or a number this server does not know."""
    try:
        name = events_pb2.EventType.Name(value)
    except ValueError:
        name = ""
    if not name.startswith("EVENT_TYPE_") or name == "EVENT_TYPE_UNSPECIFIED":
        raise InvalidArgument(f"event type {value} is not an event type: use one of EventType's values except UNSPECIFIED")
    return EventType(name.removeprefix("EVENT_TYPE_").lower())


def event_to_proto(e: Event) -> events_pb2.Event:
    pb = events_pb2.Event(
        id=e.id, type=event_type_to_proto(e.type), queue=e.queue, enqueue_id=str(e.enqueue_id or ""), name=e.name,
        sender=e.sender, attempt=e.attempt, reason=e.reason, replica=e.replica, traceparent=e.traceparent,
        details=dict(e.details), cursor=e.cursor,
        actor=events_pb2.Actor(kind=events_pb2.ActorKind.Value("ACTOR_KIND_" + e.actor.kind.upper()), role=e.actor.role,
                               identity=e.actor.identity),
    )
    pb.time.CopyFrom(timestamp_to_proto(e.time))
    return pb


def event_to_bytes(e: Event) -> bytes:
    return event_to_proto(e).SerializeToString()


def event_from_proto(pb: events_pb2.Event, cursor: str = "") -> Event:
    """An event as recorded (trusted: written by this suite); ``cursor`` replaces the stored one."""
    kind = events_pb2.ActorKind.Name(pb.actor.kind).removeprefix("ACTOR_KIND_").lower()
    return Event(
        id=pb.id, time=pb.time.ToDatetime(tzinfo=_UTC), type=EventType(events_pb2.EventType.Name(pb.type).removeprefix("EVENT_TYPE_").lower()),
        queue=pb.queue, enqueue_id=uuid.UUID(pb.enqueue_id) if pb.enqueue_id else None,
        actor=Actor(kind, pb.actor.role, pb.actor.identity), name=pb.name, sender=pb.sender, attempt=pb.attempt,
        reason=pb.reason, replica=pb.replica, traceparent=pb.traceparent, details=dict(pb.details), cursor=cursor or pb.cursor,
    )


def event_from_bytes(body: bytes, cursor: str = "") -> Event:
    return event_from_proto(events_pb2.Event.FromString(body), cursor)


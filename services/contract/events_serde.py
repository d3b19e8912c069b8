"""Events: protobuf <-> domain (protos/mailqueue/v1/events.proto; services/domain/events.py).

Paired functions, round-tripped by tests/unit/test_events_serde.py.
"""

from __future__ import annotations

import datetime as dt
import operator
import uuid
from collections.abc import Sequence

from google.protobuf import timestamp_pb2

from mailqueue.v1 import events_pb2
from services.contract.serde import timestamp_to_proto
from services.domain.errors import InvalidArgument
from services.domain.events import Actor, Event, EventType

_KINDS = {"caller": events_pb2.ACTOR_KIND_CALLER, "component": events_pb2.ACTOR_KIND_COMPONENT}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}


def event_type_to_proto(t: EventType) -> events_pb2.EventType.ValueType:
    return events_pb2.EventType.Value(f"EVENT_TYPE_{t.name}")


def event_type_from_proto(value: int) -> EventType:
    """A proto EventType as the domain's; InvalidArgument for UNSPECIFIED or an unknown number."""
    try:
        name = events_pb2.EventType.Name(value)  # type: ignore[arg-type]
    except ValueError:
        raise InvalidArgument(f"unknown event type {value}") from None
    if name == "EVENT_TYPE_UNSPECIFIED":
        raise InvalidArgument("event type is unspecified")
    return EventType[name.removeprefix("EVENT_TYPE_")]


def actor_to_proto(a: Actor) -> events_pb2.Actor:
    return events_pb2.Actor(kind=_KINDS.get(a.kind, events_pb2.ACTOR_KIND_UNSPECIFIED), role=a.role, identity=a.identity)


def actor_from_proto(pb: events_pb2.Actor) -> Actor:
    return Actor(_KIND_NAMES.get(pb.kind, "caller"), pb.role, pb.identity)


def event_to_proto(e: Event) -> events_pb2.Event:
    pb = events_pb2.Event(
        id=e.id, type=event_type_to_proto(e.type), queue=e.queue, enqueue_id=str(e.enqueue_id) if e.enqueue_id else "",
        name=e.name, sender=e.sender, attempt=e.attempt, reason=e.reason, replica=e.replica,
        actor=actor_to_proto(e.actor), traceparent=e.traceparent, details=dict(e.details), cursor=e.cursor,
    )
    pb.time.CopyFrom(timestamp_to_proto(e.time))
    return pb


def event_to_bytes(e: Event) -> bytes:
    """One event, serialized (the event stream's message body before EventBatch)."""
    return event_to_proto(e).SerializeToString()


def batch_to_bytes(events: Sequence[Event], replica: str = "") -> bytes:
    """An EventBatch of ``events``, in order (the event stream's message body, a history row's
    events); ``replica`` names the recording process where an event names none."""
    return batch_of_encoded(encode_each(events, replica))


def encode_each(events: Sequence[Event], replica: str = "") -> list[bytes]:
    """Each event serialized (an Event message), ``replica`` filled in where an event names none:
    encoded once, then joined into as many EventBatch bodies as need them (``batch_of_encoded``).

    The same message as ``event_to_proto``'s, built with only the fields that are set (a
    delivered mail encodes two events: an empty map or string passed to the constructor costs as
    much as a set one), its type and actor from tables; round-tripped by tests/unit/test_events_serde.py."""
    out = []
    for e in events:
        d = e.time - _EPOCH if e.time.tzinfo is not None else e.time.astimezone(dt.timezone.utc) - _EPOCH
        fields: dict[str, object] = {
            "id": e.id, "type": _TYPES[e.type], "queue": e.queue, "actor": _actor(e.actor),
            "time": timestamp_pb2.Timestamp(seconds=d.days * 86_400 + d.seconds, nanos=d.microseconds * 1000),
        }
        if e.enqueue_id is not None:
            fields["enqueue_id"] = str(e.enqueue_id)
        if e.replica or replica:
            fields["replica"] = e.replica or replica
        for name, value in zip(_OPTIONAL, _optional(e)):
            if value:
                fields[name] = value
        out.append(events_pb2.Event(**fields).SerializeToString())
    return out


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: Fields left out of the message when empty, and their values read at once.
_OPTIONAL = ("name", "sender", "attempt", "reason", "traceparent", "details", "cursor")
_optional = operator.attrgetter(*_OPTIONAL)
_TYPES = {t: events_pb2.EventType.Value(f"EVENT_TYPE_{t.name}") for t in EventType}
#: Actors seen, as messages (a process meets a few: its callers' roles and its components).
_ACTORS: dict[Actor, events_pb2.Actor] = {}


def _actor(a: Actor) -> events_pb2.Actor:
    pb = _ACTORS.get(a)
    if pb is None:
        pb = actor_to_proto(a)
        if len(_ACTORS) < 4096:  # a cache, not a registry: past that many identities, built each time
            _ACTORS[a] = pb
    return pb


def batch_of_encoded(encoded: Sequence[bytes]) -> bytes:
    """The EventBatch of serialized events, without decoding them: a repeated message field is
    its elements' bytes, each behind the field's tag and its length (the protobuf wire format)."""
    return b"".join(_BATCH_EVENTS_TAG + _varint(len(b)) + b for b in encoded)


#: EventBatch.events: field 1, wire type 2 (length-delimited).
_BATCH_EVENTS_TAG = bytes([1 << 3 | 2])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch_from_bytes(body: bytes) -> list[events_pb2.Event]:
    """The events of an EventBatch body, in order (DecodeError if it is none)."""
    return list(events_pb2.EventBatch.FromString(body).events)


def event_from_proto(pb: events_pb2.Event, cursor: str = "") -> Event:
    """An event as recorded; ``cursor`` (its stream position) replaces the stored one."""
    return Event(
        id=pb.id, time=pb.time.ToDatetime(tzinfo=dt.timezone.utc), type=event_type_from_proto(pb.type), queue=pb.queue,
        enqueue_id=uuid.UUID(pb.enqueue_id) if pb.enqueue_id else None, actor=actor_from_proto(pb.actor), name=pb.name,
        sender=pb.sender, attempt=pb.attempt, reason=pb.reason, replica=pb.replica, traceparent=pb.traceparent,
        details=dict(pb.details), cursor=cursor or pb.cursor,
    )


def event_from_bytes(body: bytes, cursor: str = "") -> Event:
    return event_from_proto(events_pb2.Event.FromString(body), cursor)


def history_request_from_proto(pb: events_pb2.GetMailHistoryRequest) -> tuple[uuid.UUID | None, str | None]:
    """(enqueue id, None) or (None, name); InvalidArgument for neither, an empty one, or a malformed id
    (a oneof cannot carry both)."""
    which = pb.WhichOneof("mail")
    if which == "enqueue_id":
        try:
            return uuid.UUID(pb.enqueue_id), None
        except ValueError:
            raise InvalidArgument(f"enqueue_id {pb.enqueue_id[:80]!r} is not a UUID: give a full enqueue id "
                                  "(mailq trace resolves a prefix)") from None
    if which == "name" and pb.name:
        return None, pb.name
    raise InvalidArgument("give an enqueue_id or a name (exactly one, not empty)")


"""Events: protobuf <-> domain (protos/mailqueue/v1/events.proto; services/domain/events.py).

Paired functions, round-tripped by tests/unit/test_events_serde.py.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence

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

    Written straight to the protobuf wire format, fields in number order with empty ones left out:
    byte for byte the message ``event_to_proto`` serializes (tests/unit/test_events_serde.py). A
    delivered mail records two events of one mail in one call (its hand-out and its answer): what
    they share (queue to sender, replica to traceparent) is encoded once, for the first, and reused
    by the next event whose fields are equal. Building the messages through protobuf cost a
    delivery 10 µs; this, 5."""
    out = []
    mail = tail = b""
    last_mail: tuple[object, ...] = ()
    last_tail: tuple[object, ...] = ()
    for e in events:
        time = _time_field(e.time)
        ids = (e.queue, e.enqueue_id, e.name, e.sender)
        if ids != last_mail:
            last_mail = ids
            mail = b"".join((_text(b"\x22", e.queue), _text(b"\x2a", str(e.enqueue_id)) if e.enqueue_id is not None else b"",
                             _text(b"\x32", e.name), _text(b"\x3a", e.sender)))
        shared = (e.replica, e.actor, e.traceparent)
        if shared != last_tail:
            last_tail = shared
            tail = _text(b"\x52", e.replica or replica) + _actor_field(e.actor) + _text(b"\x62", e.traceparent)
        parts = [_text(b"\x0a", e.id), time, _TYPES_WIRE[e.type], mail]
        if e.attempt:
            parts += (b"\x40", _varint(e.attempt))
        if e.reason:
            parts.append(_text(b"\x4a", e.reason))
        parts.append(tail)
        for key, value in e.details.items():
            entry = _entry_text(b"\x0a", key) + _entry_text(b"\x12", value)  # a map entry writes both, even empty
            parts += (b"\x6a", _varint(len(entry)), entry)
        if e.cursor:
            parts.append(_text(b"\x72", e.cursor))
        out.append(b"".join(parts))
    return out


def _varint(n: int) -> bytes:
    """A varint on the wire; a negative one (a time before 1970) as its 64-bit two's complement."""
    if 0 <= n < 128:
        return _SMALL[n]
    n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _time_field(at: dt.datetime) -> bytes:
    """Event.time on the wire (field 2, a Timestamp): the events of a second share its seconds'
    bytes (kept from the last call), and a whole millisecond's nanos come from a table."""
    global _last_second
    d = at - _EPOCH if at.tzinfo is not None else at.astimezone(dt.timezone.utc) - _EPOCH
    seconds = d.days * 86_400 + d.seconds
    last = _last_second  # read once: a pair, replaced whole
    if seconds != last[0]:
        last = _last_second = (seconds, b"\x08" + _varint(seconds) if seconds else b"")
    micros = d.microseconds
    nanos = _MILLIS[micros // 1000] if micros % 1000 == 0 else b"\x10" + _varint(micros * 1000)
    body = last[1] + nanos
    return b"\x12" + _SMALL[len(body)] + body


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: The one-byte varints.
_SMALL = [bytes([i]) for i in range(128)]
_last_second: tuple[int, bytes] = (0, b"")
#: Timestamp.nanos (field 2) of each whole millisecond (none for 0: an empty field is left out).
_MILLIS = [b"\x10" + _varint(ms * 1_000_000) if ms else b"" for ms in range(1000)]
#: Event.type as its field on the wire (field 3, a varint): tag and value.
_TYPES_WIRE = {t: b"\x18" + bytes([events_pb2.EventType.Value(f"EVENT_TYPE_{t.name}")]) for t in EventType}
#: Actors seen, as their Event.actor field (field 11) on the wire: a process meets a few (its
#: callers' roles and its components).
_ACTORS: dict[Actor, bytes] = {}


def _actor_field(a: Actor) -> bytes:
    field = _ACTORS.get(a)
    if field is None:
        body = actor_to_proto(a).SerializeToString()
        field = b"\x5a" + _varint(len(body)) + body
        if len(_ACTORS) < 4096:  # a cache, not a registry: past that many identities, built each time
            _ACTORS[a] = field
    return field


def _entry_text(tag: bytes, value: str) -> bytes:
    data = value.encode()
    return tag + _varint(len(data)) + data


def _text(tag: bytes, value: str) -> bytes:
    """A string field on the wire (tag, length, UTF-8), or nothing when it is empty."""
    if not value:
        return b""
    data = value.encode()
    n = len(data)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + data


def batch_of_encoded(encoded: Sequence[bytes]) -> bytes:
    """The EventBatch of serialized events, without decoding them: a repeated message field is
    its elements' bytes, each behind the field's tag and its length (the protobuf wire format)."""
    return b"".join(_BATCH_EVENTS_TAG + _varint(len(b)) + b for b in encoded)


#: EventBatch.events: field 1, wire type 2 (length-delimited).
_BATCH_EVENTS_TAG = bytes([1 << 3 | 2])


def batch_from_bytes(body: bytes) -> list[events_pb2.Event]:
    """The events of an EventBatch body, in order (DecodeError if it is none)."""
    return list(events_pb2.EventBatch.FromString(body).events)


def event_from_proto(pb: events_pb2.Event, cursor: str = "") -> Event:
    """An event as recorded; ``cursor`` (its stream position) replaces the stored one. ValueError
    for one this version cannot read (a type a newer version added, during a rolling update)."""
    try:
        kind = event_type_from_proto(pb.type)
    except InvalidArgument as e:
        raise ValueError(f"{e} (written by a newer version?)") from None
    return Event(
        id=pb.id, time=pb.time.ToDatetime(tzinfo=dt.timezone.utc), type=kind, queue=pb.queue,
        enqueue_id=uuid.UUID(pb.enqueue_id) if pb.enqueue_id else None, actor=actor_from_proto(pb.actor), name=pb.name,
        sender=pb.sender, attempt=pb.attempt, reason=pb.reason, replica=pb.replica, traceparent=pb.traceparent,
        details=dict(pb.details), cursor=cursor or pb.cursor,
    )


def event_from_bytes(body: bytes, cursor: str = "") -> Event:
    return event_from_proto(events_pb2.Event.FromString(body), cursor)


def readable(pbs: Iterable[tuple[str, events_pb2.Event]], skipped: Callable[[events_pb2.Event, ValueError], None]) -> list[Event]:
    """The events of (cursor, event) pairs this version can read; each other one goes to ``skipped``
    and the rest are still read (one event of an unknown type never hides the others)."""
    out = []
    for cursor, pb in pbs:
        try:
            out.append(event_from_proto(pb, cursor))
        except ValueError as e:
            skipped(pb, e)
    return out


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


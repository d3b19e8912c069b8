"""The event stream's cursors and filters (services/ports/events.py: EventStream.watch).

The stream holds messages (RabbitMQ stream offsets), each an EventBatch of the events recorded
together. An event's cursor names its message and its place in it, as one decimal number:
``offset * 2**INDEX_BITS + index``. Cursors so grow with the stream, as the offsets do, and a
client may compare them as numbers. Resuming from a cursor sends that event again, then every event
after it. The stream also starts at its oldest event kept (``FIRST``) or at the next event
recorded (``NEXT``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from services.domain.errors import InvalidArgument
from services.domain.events import HISTORY_ONLY, Event, EventType

FIRST = "first"
NEXT = "next"
#: The bits of a cursor that give the event's place in its message.
INDEX_BITS = 16
#: Events in one stream message at most (a cursor's index must hold each one's place).
MAX_PER_MESSAGE = 1000
#: The largest cursor (a signed 64-bit integer; a stream offset is one, too).
MAX_CURSOR = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a watch starts: the stream offset to consume from (a number, FIRST or NEXT), and the
    first event to send of the message at that offset (the ones before it were sent already)."""

    offset: int | str
    index: int = 0

    def wants(self, offset: int, index: int) -> bool:
        """Whether the event at (offset, index) is at or after the start."""
        if not isinstance(self.offset, int):
            return True
        return (offset, index) >= (self.offset, self.index)


#: What a watch ended for rebalancing says (services/app/event_watch.py): mailq events reads it as
#: a planned end, not a failure.
REBALANCED = "watch again from the last cursor received"


def start(cursor: str, from_oldest: bool = False) -> Start:
    """Where a watch starts: a cursor's event, or FIRST (from_oldest), or NEXT. A cursor that is not
    a decimal number below 2**63 is INVALID_ARGUMENT: nothing is read. A place past any event's
    (an index of ``MAX_PER_MESSAGE`` or more) is a place all the same: after every event of its
    message. A webhook endpoint saves the place just before its first event read (that cursor
    minus one: the previous message, index 2**16 - 1), so a restart reads that event again."""
    if not cursor:
        return Start(FIRST if from_oldest else NEXT)
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 19 or int(cursor) > MAX_CURSOR:
        raise InvalidArgument(
            f"cursor {cursor[:40]!r} is not a cursor of this stream: give the cursor of an event WatchEvents sent "
            "(a decimal number), or none to watch from now on (from_oldest: from the oldest event kept)"
        )
    c = int(cursor)
    return Start(c >> INDEX_BITS, c & (2**INDEX_BITS - 1))


def cursor_of(offset: int, index: int = 0) -> str:
    """The cursor of the ``index``-th event of the message at ``offset``."""
    if not 0 <= index < 2**INDEX_BITS:
        raise ValueError(f"an event's place in its message is {index}: at most {2**INDEX_BITS - 1}")
    return str(offset << INDEX_BITS | index)


@dataclasses.dataclass(frozen=True)
class EventFilter:
    """Which events a watcher wants: every one of these queues and types (empty: any)."""

    queues: frozenset[str] = frozenset()
    types: frozenset[EventType] = frozenset()

    @classmethod
    def of(cls, queues: Collection[str] = (), types: Collection[EventType] = ()) -> EventFilter:
        return cls(frozenset(queues), frozenset(types))

    def __call__(self, event: Event) -> bool:
        return (not self.queues or event.queue in self.queues) and (not self.types or event.type in self.types)


def streamed(types: Collection[EventType]) -> list[EventType]:
    """``types`` to watch on the stream (a watch, a webhook): InvalidArgument for a type written to
    the mail history only, which a watch would wait for forever."""
    unstreamed = sorted(t.value for t in types if t in HISTORY_ONLY)
    if unstreamed:
        raise InvalidArgument(f"{', '.join(unstreamed)} events are in the mail history only (GetMailHistory, mailq trace), "
                              "never on the event stream: leave them out of the types")
    return list(types)


def messages_missed(resumed_from: str, first: str) -> int:
    """The stream messages certainly missed by a watch resumed from cursor ``resumed_from`` whose
    first event has cursor ``first``: offsets are consecutive, so any message between the two was
    removed by the stream's retention before it was read (0: none missed)."""
    return max(0, (int(first) >> INDEX_BITS) - (int(resumed_from) >> INDEX_BITS) - 1)

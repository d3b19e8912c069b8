"""The event stream's cursors and filters (services/ports/events.py: EventStream.watch).

A cursor is an event's position in the stream (RabbitMQ's stream offset), written as a decimal
string: resuming from cursor N sends event N again, then every event after it. The stream also
starts at its oldest event kept (``FIRST``) or at the next event recorded (``NEXT``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from services.domain.errors import InvalidArgument
from services.domain.events import Event, EventType

FIRST = "first"
NEXT = "next"
#: The largest offset a cursor may name (a stream offset is a signed 64-bit integer).
MAX_OFFSET = 2**63 - 1


def start(cursor: str, from_oldest: bool = False) -> int | str:
    """Where a watch starts: a cursor's offset, or FIRST (from_oldest), or NEXT. A cursor that is
    not a decimal offset is INVALID_ARGUMENT: nothing is read."""
    if not cursor:
        return FIRST if from_oldest else NEXT
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 19 or int(cursor) > MAX_OFFSET:
        raise InvalidArgument(
            f"cursor {cursor[:40]!r} is not a cursor of this stream: give the cursor of an event WatchEvents sent "
            "(a decimal number), or none to watch from now on (from_oldest: from the oldest event kept)"
        )
    return int(cursor)


def cursor_of(offset: int) -> str:
    return str(offset)


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

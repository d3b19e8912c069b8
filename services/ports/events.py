"""Where events go, and where they are read back (services/domain/events.py says what an event is).

Contracts:
- ``EventLog.record`` returns once every event given is durable in the history **and** confirmed
  by the event stream; otherwise it raises BackendUnavailable (the caller's change is then not
  acknowledged either, and a retry writes the same event ids again). Implementations batch: many
  concurrent calls share one write and one confirm (never a round trip per event).
- ``EventLog.history`` returns a mail's events oldest first, at the same cost whatever the
  history holds (one partition per mail); ``history_by_name`` reads a name's index first.
- ``EventStream.watch`` yields events in stream order from a cursor (None: from now on, or from
  the oldest kept), each with its cursor, until the caller stops iterating; a malformed cursor is
  InvalidArgument, one past the stream's last event (a stream declared again since) OutOfRange.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from services.domain.events import Event


class EventLog(Protocol):
    async def record(self, events: Sequence[Event]) -> None: ...

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]: ...

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]: ...


class EventStream(Protocol):
    def watch(self, cursor: str | None, from_oldest: bool = False) -> AsyncIterator[Event]: ...


class Unrecorded:
    """An EventLog that keeps nothing: MAILQUEUE_EVENTS=off (to measure what events cost), and
    the use-cases built without one (bench/)."""

    async def record(self, events: Sequence[Event]) -> None:
        return None

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        return []

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        return []

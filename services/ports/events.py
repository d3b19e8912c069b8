"""Where events go, and where they are read back (services/domain/events.py says what an event is).

Contracts:
- ``EventLog.record`` returns once every event given is durable in the history **and** confirmed
  by the event stream; otherwise it raises BackendUnavailable (the caller's change is then not
  acknowledged either, and a retry writes the same event ids again). Implementations batch: many
  concurrent calls share one write and one confirm (never a round trip per event).
- ``EventLog.history`` returns a mail's events oldest first, at the same cost whatever the
  history holds (one partition per mail); ``history_by_name`` reads a name's index first.
- ``EventStream.watch`` yields events in stream order from a cursor (None: from now on, or from
  the oldest kept), each with its cursor, until the caller stops iterating.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
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


@dataclasses.dataclass(frozen=True)
class EncodedEvents:
    """The events of one stream message as they are stored (each a serialized mailqueue.v1.Event),
    the cursors of the first and the last, and the last one's time."""

    first: str
    last: str
    events: list[bytes]
    last_time: dt.datetime


class EncodedEventStream(Protocol):
    """The stream read a message at a time, not decoded (what the history projector copies)."""

    def watch_encoded(self, cursor: str | None, from_oldest: bool = False) -> AsyncIterator[EncodedEvents]: ...


class HistoryWriter(Protocol):
    """Writes serialized events to the history as ``EventLog.record`` would (no sink after)."""

    async def record_encoded(self, encoded: Sequence[bytes]) -> None: ...

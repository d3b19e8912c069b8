"""GetMailHistory as a use-case: a mail's story, by enqueue id or by name (services/ports/events.py).

Nothing recorded is an empty story, never NOT_FOUND: the mail may be older than the retention.
"""

from __future__ import annotations

import uuid

from services.domain.errors import InvalidArgument
from services.domain.events import Event
from services.ports.events import EventLog

#: Mails a history by name covers at most (the newest of the name).
MAX_MAILS_BY_NAME = 100
#: A longer name is no mail's (names are metadata, bounded with it): refused, nothing read.
MAX_NAME_BYTES = 4096


class History:
    def __init__(self, events: EventLog) -> None:
        self._events = events

    async def of(self, enqueue_id: uuid.UUID | None, name: str | None) -> list[Event]:
        """The events of the mail ``enqueue_id``, or of the mails named ``name``, oldest first.
        Raises BackendUnavailable when the history cannot be read."""
        if enqueue_id is not None:
            return await self._events.history(enqueue_id)
        assert name is not None
        if len(name.encode()) > MAX_NAME_BYTES:
            raise InvalidArgument(f"name is longer than {MAX_NAME_BYTES} bytes")
        return await self._events.history_by_name(name, MAX_MAILS_BY_NAME)

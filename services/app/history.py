"""GetMailHistory as a use-case: a mail's story, by enqueue id or by name (services/ports/events.py).

Nothing recorded is an empty story, never NOT_FOUND: the mail may be older than the retention.
"""

from __future__ import annotations

import asyncio
import uuid

from services.domain.errors import InvalidArgument
from services.domain.events import Event, landed_id, ordered
from services.domain.validation import MAX_NAME_BYTES
from services.ports.events import EventLog

#: Mails a history by name covers at most (the newest of the name).
MAX_MAILS_BY_NAME = 100
#: Moves and redrives a history by enqueue id follows at most (each hop one more partition read).
MAX_HOPS = 16


class History:
    def __init__(self, events: EventLog) -> None:
        self._events = events

    async def of(self, enqueue_id: uuid.UUID | None, name: str | None) -> list[Event]:
        """The events of the mail ``enqueue_id`` (and of the ids its moves and redrives gave it, at
        most ``MAX_HOPS`` deep), or of the mails named ``name`` (the copies moves and redrives made
        included), oldest first. Raises BackendUnavailable when the history cannot be read."""
        if enqueue_id is not None:
            return await self._following(enqueue_id)
        assert name is not None
        if len(name.encode()) > MAX_NAME_BYTES:
            raise InvalidArgument(f"name is longer than {MAX_NAME_BYTES} bytes: no mail has such a name")
        return await self._events.history_by_name(name, MAX_MAILS_BY_NAME)

    async def _following(self, enqueue_id: uuid.UUID) -> list[Event]:
        """One partition read per id the mail had: the first, then those its landings name."""
        story: list[Event] = []
        seen, ids = {enqueue_id}, [enqueue_id]
        for _ in range(MAX_HOPS + 1):
            if not ids:
                break
            histories = await asyncio.gather(*(self._events.history(i) for i in ids))
            ids = []
            for e in (e for h in histories for e in h):
                story.append(e)
                landed = landed_id(e)
                if landed is not None and landed not in seen:
                    seen.add(landed)
                    ids.append(landed)
        return ordered(story)

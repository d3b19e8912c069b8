"""The event log of MAILQUEUE_HISTORY_FROM_STREAM=true: a change's events go to the event stream
only, and the mail history is read from Cassandra, where browse_svc's projector writes it from the
stream (services/app/history_projector.py).

``record`` returns once the broker confirmed the events (BackendUnavailable otherwise: the change
is then not acknowledged, as with the history written inline). The stream is the record; the
history follows it by the projector's batch (``mailqueue_history_projection_lag_seconds``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
from services.contract import events_serde
from services.domain.events import Event
from services.ports.events import EventLog


class StreamFirstLog:
    def __init__(self, stream: RabbitMQEventStream, reads: EventLog, replica: str) -> None:
        self._stream = stream
        #: Where the history is read (and where the projector writes it).
        self.history_log = reads
        self._replica = replica

    async def record(self, events: Sequence[Event]) -> None:
        if events:
            await self._stream.record(events, events_serde.encode_each(events, self._replica))

    async def history(self, enqueue_id: uuid.UUID) -> list[Event]:
        return await self.history_log.history(enqueue_id)

    async def history_by_name(self, name: str, limit: int = 100) -> list[Event]:
        return await self.history_log.history_by_name(name, limit)

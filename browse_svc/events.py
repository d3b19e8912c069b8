"""EventService (served by browse_svc, the read side): protobuf <-> domain only. GetMailHistory
reads the history (services/app/history.py); WatchEvents streams the event stream from a cursor,
filtered on the server (services/app/event_watch.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import events_pb2, events_pb2_grpc
from services.app import event_watch
from services.app.history import History
from services.contract import events_serde
from services.domain import event_stream
from services.domain.event_stream import EventFilter, streamed
from services.domain.validation import queue_name
from services.ports.events import EventStream


class EventServicer(events_pb2_grpc.EventServiceServicer):
    def __init__(self, history: Callable[[], History], stream: Callable[[], EventStream], watch_s: float | None = None) -> None:
        self._history = history  # each raises UNAVAILABLE while the service connects
        self._stream = stream
        self._watch_s = watch_s  # a watch ends UNAVAILABLE after it: clients reach new replicas

    async def GetMailHistory(
        self, request: events_pb2.GetMailHistoryRequest, context: grpc.aio.ServicerContext,
    ) -> events_pb2.GetMailHistoryResponse:
        enqueue_id, name = events_serde.history_request_from_proto(request)
        found = await self._history().of(enqueue_id, name)
        return events_pb2.GetMailHistoryResponse(events=[events_serde.event_to_proto(e) for e in found])

    async def WatchEvents(
        self, request: events_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[events_pb2.WatchEventsResponse]:
        # A queue name no queue can have would match nothing, silently: refused like an unknown type
        # ("" selects the install's own events, which name no queue).
        wanted = EventFilter.of([q and queue_name(q) for q in request.queues],
                                streamed([events_serde.event_type_from_proto(t) for t in request.types]))
        event_stream.start(request.cursor, request.from_oldest)  # a malformed cursor: refused before the stream is asked
        events = event_watch.watch(self._stream(), request.cursor, request.from_oldest, wanted, self._watch_s)
        with event_watch.ended_if_stalled(events, self._watch_s):
            async with contextlib.aclosing(events):
                async for e in events:
                    yield events_pb2.WatchEventsResponse(event=events_serde.event_to_proto(e))

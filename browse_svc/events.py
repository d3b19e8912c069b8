"""EventService: protobuf <-> domain only. WatchEvents streams the event stream from a cursor,
filtered on the server (services/app/event_watch.py); GetMailHistory reads the history."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import events_pb2, events_pb2_grpc
from services.app import event_watch
from services.contract import event_serde
from services.domain.event_stream import EventFilter
from services.ports.events import EventStream


class EventServicer(events_pb2_grpc.EventServiceServicer):
    def __init__(self, stream: Callable[[], EventStream]) -> None:
        self._stream = stream  # raises UNAVAILABLE while the service connects

    async def GetMailHistory(
        self, request: events_pb2.GetMailHistoryRequest, context: grpc.aio.ServicerContext,
    ) -> events_pb2.GetMailHistoryResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetMailHistory is not served by this version yet")
        raise AssertionError("unreachable")

    async def WatchEvents(
        self, request: events_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[events_pb2.WatchEventsResponse]:
        wanted = EventFilter.of(request.queues, [event_serde.event_type_from_proto(t) for t in request.types])
        events = event_watch.watch(self._stream(), request.cursor, request.from_oldest, wanted)
        async with contextlib.aclosing(events):
            async for e in events:
                yield events_pb2.WatchEventsResponse(event=event_serde.event_to_proto(e))


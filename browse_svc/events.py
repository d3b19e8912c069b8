"""EventService (served by browse_svc, the read side): protobuf <-> domain only; the work is in
services/app/history.py. WatchEvents is served where the event stream is (not here yet)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from mailqueue.v1 import events_pb2, events_pb2_grpc
from services.app.history import History
from services.contract import events_serde


class EventServicer(events_pb2_grpc.EventServiceServicer):
    def __init__(self, history: Callable[[], History]) -> None:
        self._history = history  # raises UNAVAILABLE while the service connects

    async def GetMailHistory(
        self, request: events_pb2.GetMailHistoryRequest, context: grpc.aio.ServicerContext,
    ) -> events_pb2.GetMailHistoryResponse:
        enqueue_id, name = events_serde.history_request_from_proto(request)
        found = await self._history().of(enqueue_id, name)
        return events_pb2.GetMailHistoryResponse(events=[events_serde.event_to_proto(e) for e in found])

"""The dead-letter RPCs of BrowseService (browse, count) and AdminService (redrive, purge):
protobuf <-> domain only; the work is in services/app/dead_letter_admin.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import admin_pb2, browse_pb2
from services.app.dead_letter_admin import DeadLetterAdmin
from services.contract import dead_letter_serde as s
from services.domain import model


class DeadLetterBrowseServicer:
    _dead_letters: Callable[[], DeadLetterAdmin]

    async def BrowseDeadLetters(
        self, request: browse_pb2.BrowseDeadLettersRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[browse_pb2.BrowseDeadLettersResponse]:
        f = s.filter_from_proto(request.filter)
        async for d, token in self._dead_letters().browse(request.queue, f, request.limit, request.page_size, request.page_token):
            response = s.dead_letter_to_proto(d)
            response.next_page_token = token
            yield response

    async def CountDeadLetters(
        self, request: browse_pb2.CountDeadLettersRequest, context: grpc.aio.ServicerContext,
    ) -> browse_pb2.CountDeadLettersResponse:
        return s.counts_to_proto(await self._dead_letters().counts(request.queue, request.exact))


class DeadLetterAdminServicer:
    _dead_letters: Callable[[], DeadLetterAdmin]

    async def RedriveDeadLetters(
        self, request: admin_pb2.RedriveDeadLettersRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.RedriveDeadLettersResponse]:
        f = s.filter_from_proto(request.filter)
        async for p in self._dead_letters().redrive(request.queue, f, request.to_queue, request.per_second, request.keep_attempts,
                                                    request.limit):
            yield admin_pb2.RedriveDeadLettersResponse(scanned=p.scanned, redriven=p.redriven, resumed=p.resumed, done=p.done)

    async def PurgeDeadLetters(
        self, request: admin_pb2.PurgeDeadLettersRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.PurgeDeadLettersResponse]:
        older_than = request.older_than if request.HasField("older_than") else None
        f = s.filter_from_proto(request.filter, older_than, model.utcnow())
        async for p in self._dead_letters().purge(request.queue, f, request.all):
            yield admin_pb2.PurgeDeadLettersResponse(scanned=p.scanned, purged=p.purged, done=p.done)

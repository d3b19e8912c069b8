"""EnqueueService: protobuf <-> domain only; the work is in services/app/enqueuer.py.

Every RPC reads the call's ``traceparent`` metadata (services/domain/trace.py): every mail the
call enqueues carries it; a malformed one refuses the call (INVALID_ARGUMENT) before anything."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import enqueue_pb2, enqueue_pb2_grpc
from services.app import pipeline
from services.app.enqueuer import BlobRefs, Content, Enqueuer, Inline, Streamed
from services.contract import serde
from services.domain import model, trace
from services.domain.errors import InvalidArgument, MailQueueError
from services.runtime.status import details_of, number_of

log = logging.getLogger(__name__)

#: Mails of one EnqueueMany stream being enqueued at once (their publishes pipeline their confirms).
MANY_IN_FLIGHT = 128


def _receipt(r: model.EnqueueResult) -> enqueue_pb2.Receipt:
    return enqueue_pb2.Receipt(
        enqueue_id=str(r.enqueue_id), enqueued_at=serde.timestamp_to_proto(r.enqueued_at),
        blob_ids=list(r.blob_ids), size=r.size, duplicate=r.duplicate,
    )


def _answer(item: enqueue_pb2.EnqueueManyRequest, result: model.EnqueueResult | BaseException) -> enqueue_pb2.EnqueueManyResponse:
    response = enqueue_pb2.EnqueueManyResponse(sequence=item.sequence)
    if isinstance(result, MailQueueError):
        response.error.code, response.error.message = number_of(result), str(result)[:2000]
        response.error.details.extend(details_of(result))
    elif isinstance(result, BaseException):
        log.error("enqueue of a stream failed", exc_info=result)
        response.error.code, response.error.message = grpc.StatusCode.INTERNAL.value[0], "internal error; the server log has the details"
    else:
        response.receipt.CopyFrom(_receipt(result))
    return response


async def _distinct(
    requests: AsyncIterator[enqueue_pb2.EnqueueManyRequest], unanswered: set[int],
) -> AsyncIterator[enqueue_pb2.EnqueueManyRequest]:
    """The stream's mails; a sequence number still unanswered on it ends the stream
    INVALID_ARGUMENT once the mails before are answered (two answers would carry it)."""
    async for r in requests:
        if r.sequence in unanswered:
            raise InvalidArgument(f"sequence {r.sequence} is already in flight on this stream: give each mail a "
                                  "sequence of its own; the mails before it are answered, it and the rest are not enqueued")
        unanswered.add(r.sequence)
        yield r


class EnqueueServicer(enqueue_pb2_grpc.EnqueueServiceServicer):
    def __init__(self, enqueuer: Callable[[], Enqueuer]) -> None:
        self._enqueuer = enqueuer  # raises UNAVAILABLE while the service connects

    async def Enqueue(self, request: enqueue_pb2.EnqueueRequest, context: grpc.aio.ServicerContext) -> enqueue_pb2.EnqueueResponse:
        with trace.carrying(trace.from_metadata(context.invocation_metadata())):
            return enqueue_pb2.EnqueueResponse(receipt=_receipt(await self._enqueue(request)))

    async def EnqueueMany(
        self, request_iterator: AsyncIterator[enqueue_pb2.EnqueueManyRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[enqueue_pb2.EnqueueManyResponse]:
        self._enqueuer()  # UNAVAILABLE for the whole stream while connecting
        unanswered: set[int] = set()
        with trace.carrying(trace.from_metadata(context.invocation_metadata())):
            async for item, result in pipeline.unordered(_distinct(request_iterator, unanswered),
                                                         self._enqueue_one, MANY_IN_FLIGHT):
                unanswered.discard(item.sequence)
                yield _answer(item, result)

    async def EnqueueBatches(
        self, request_iterator: AsyncIterator[enqueue_pb2.EnqueueBatchesRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[enqueue_pb2.EnqueueBatchesResponse]:
        self._enqueuer()  # UNAVAILABLE for the whole stream while connecting

        async def mails() -> AsyncIterator[enqueue_pb2.EnqueueManyRequest]:
            async for batch in request_iterator:
                if not batch.mails:
                    raise InvalidArgument("an EnqueueBatchesRequest must carry at least one mail")
                for item in batch.mails:
                    yield item

        unanswered: set[int] = set()
        with trace.carrying(trace.from_metadata(context.invocation_metadata())):
            async for group in pipeline.unordered_groups(_distinct(mails(), unanswered),
                                                         self._enqueue_one, MANY_IN_FLIGHT):
                unanswered.difference_update(item.sequence for item, _ in group)
                yield enqueue_pb2.EnqueueBatchesResponse(results=[_answer(item, result) for item, result in group])

    async def _enqueue_one(self, item: enqueue_pb2.EnqueueManyRequest) -> model.EnqueueResult:
        """One mail of a stream. Its answer needs its sequence only: the request (its content) is
        let go once enqueued, so answers a client has not read yet hold no content."""
        try:
            return await self._enqueue(item.request)
        finally:
            item.ClearField("request")

    async def _enqueue(self, request: enqueue_pb2.EnqueueRequest) -> model.EnqueueResult:
        enqueuer = self._enqueuer()
        mail = serde.mail_from_proto(request.mail)
        when, priority = serde.schedule_from_proto(request), serde.priority_from_proto(request.priority)
        kind = request.WhichOneof("content")
        content: Content
        if kind == "inline_content":
            content = Inline(request.inline_content)
        elif kind == "blob_refs":
            content = BlobRefs(tuple(request.blob_refs.blob_ids))
        else:
            raise InvalidArgument("content is missing: set inline_content or blob_refs")
        return await enqueuer.enqueue(request.queue, mail, content, request.idempotency_key, when, priority)

    async def EnqueueStream(
        self, request_iterator: AsyncIterator[enqueue_pb2.EnqueueStreamRequest], context: grpc.aio.ServicerContext
    ) -> enqueue_pb2.EnqueueStreamResponse:
        enqueuer = self._enqueuer()
        traceparent = trace.from_metadata(context.invocation_metadata())
        stream = aiter(request_iterator)
        first = await anext(stream, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidArgument("the first message of EnqueueStream must be the header")
        header = first.header

        async def chunks() -> AsyncIterator[bytes]:
            async for request in stream:
                if request.WhichOneof("part") != "chunk":
                    raise InvalidArgument("only the first message of EnqueueStream may be a header")
                yield request.chunk

        with trace.carrying(traceparent):
            result = await enqueuer.enqueue(
                header.queue, serde.mail_from_proto(header.mail), Streamed(chunks()), header.idempotency_key,
                serde.schedule_from_proto(header), serde.priority_from_proto(header.priority),
            )
        return enqueue_pb2.EnqueueStreamResponse(receipt=_receipt(result))

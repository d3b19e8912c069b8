"""DequeueService: protobuf <-> domain only; the stream's work is in services/app/dequeue_stream.py.

One stream = one subscription. Outcomes are read concurrently with the deliveries being sent;
when the client half-closes, the server stops delivering and ends the stream, and whatever was
left unanswered goes back to the queue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import dequeue_pb2, dequeue_pb2_grpc
from services.app import dequeue_stream
from services.app.dequeue_stream import Answer
from services.app.dequeuer import Dequeuer
from services.app.subscription import Delivery, Outcome
from services.contract import serde
from services.domain import delivery_tags, validation
from services.domain.errors import InvalidArgument

_OUTCOMES = {
    dequeue_pb2.OUTCOME_KIND_SUCCESS: Outcome.SUCCESS,
    dequeue_pb2.OUTCOME_KIND_RETRY: Outcome.RETRY,
    dequeue_pb2.OUTCOME_KIND_REJECT: Outcome.REJECT,
}


def _fill(pb: dequeue_pb2.Delivery, d: Delivery, prefix: int) -> None:
    """Write ``d`` into a message already in place: a message passed to a constructor is copied,
    content included (measured: 236 µs per 100 KB delivery of a batch of 32, 123 µs in place).
    Its tag is the stream's (services/domain/delivery_tags.py)."""
    pb.delivery_tag, pb.content_inline, pb.redelivered = delivery_tags.outward(prefix, d.tag), d.content is not None, d.redelivered
    pb.traceparent = d.mail.traceparent
    if d.content:
        pb.content = d.content
    pb.mail.CopyFrom(serde.queued_mail_to_proto(d.mail))
    if d.handed_out_at is not None:
        pb.handed_out_at.CopyFrom(serde.timestamp_to_proto(d.handed_out_at))


#: A Deliveries message is at most this long, unless one delivery alone is longer: every gRPC
#: client receives 4 MiB by default, and a batch of inline content (max_batch 32 of 600 KB mails:
#: 19 MiB) was refused by the client, or past 16 MiB by the server, every time it was sent again,
#: until the broker's delivery limit dead-lettered mails no client ever saw.
RESPONSE_BYTES = 4 * 1024 * 1024 - 64 * 1024


def _bound(batch: list[Delivery]) -> int:
    """An upper bound of a Deliveries message's length, without encoding it: the contents, each
    mail's addresses (and their framing), its metadata, and 4 KiB for the rest (its ids, times,
    queue, last error of at most 1,000 characters, traceparent)."""
    return sum(len(d.content or b"") + 4096 + validation.metadata_bytes(d.mail.mail) + len(d.mail.mail.sender.encode())
               + sum(len(r.encode()) + 4 for r in d.mail.mail.recipients) for d in batch)


def _responses(batch: list[Delivery], max_batch: int, prefix: int) -> list[dequeue_pb2.DequeueResponse]:
    """One delivery alone, or (max_batch above 1) the deliveries ready together, in as many
    Deliveries messages of at most RESPONSE_BYTES as they need, in order."""
    response = dequeue_pb2.DequeueResponse()
    if max_batch == 1:
        _fill(response.delivery, batch[0], prefix)
        return [response]
    deliveries = response.deliveries.deliveries
    for d in batch:
        _fill(deliveries.add(), d, prefix)
    if len(batch) == 1 or _bound(batch) <= RESPONSE_BYTES or response.ByteSize() <= RESPONSE_BYTES:
        return [response]  # (ByteSize encodes the whole message: only when the cheap bound is over)
    parts: list[dequeue_pb2.DequeueResponse] = []
    size = 0
    for pb in deliveries:
        weight = pb.ByteSize() + 8  # and its tag and length in the message
        if not parts or size + weight > RESPONSE_BYTES:
            parts.append(dequeue_pb2.DequeueResponse())
            size = 0
        parts[-1].deliveries.deliveries.add().CopyFrom(pb)
        size += weight
    return parts


def _outcomes(request: dequeue_pb2.DequeueRequest) -> list[dequeue_pb2.Outcome]:
    """The outcomes a request carries; InvalidArgument for a message that carries none."""
    kind = request.WhichOneof("kind")
    if kind == "outcome":
        return [request.outcome]
    if kind == "outcomes" and request.outcomes.outcomes:
        return list(request.outcomes.outcomes)
    if kind == "outcomes":
        raise InvalidArgument("an Outcomes message must carry at least one outcome")
    raise InvalidArgument("only the first message of a Dequeue stream may be a subscribe")


def _answer(o: dequeue_pb2.Outcome) -> Answer:
    """One outcome as an answer; InvalidArgument for one without a kind or with a retry_after out of range."""
    if o.kind not in _OUTCOMES:
        raise InvalidArgument(f"outcome for delivery {o.delivery_tag} has no kind: use SUCCESS, RETRY or REJECT")
    return Answer(o.delivery_tag, _OUTCOMES[o.kind], o.error_message, serde.retry_after_from_proto(o))


async def _answers(requests: AsyncIterator[dequeue_pb2.DequeueRequest]) -> AsyncIterator[list[Answer]]:
    """Each request's outcomes as answers. An invalid outcome ends the stream with its error once
    the answers before it in its message are carried out: each outcome of an Outcomes message is
    settled as if sent alone (a SUCCESS before an invalid answer is never delivered again)."""
    async for request in requests:
        answers: list[Answer] = []
        try:
            for o in _outcomes(request):
                answers.append(_answer(o))
        except InvalidArgument:
            if answers:
                yield answers
            raise
        yield answers


class DequeueServicer(dequeue_pb2_grpc.DequeueServiceServicer):
    def __init__(self, dequeuer: Callable[[], Dequeuer]) -> None:
        self._dequeuer = dequeuer  # raises UNAVAILABLE while the service connects

    async def Dequeue(
        self, request_iterator: AsyncIterator[dequeue_pb2.DequeueRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dequeue_pb2.DequeueResponse]:
        dequeuer = self._dequeuer()
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "subscribe":
            raise InvalidArgument("the first message of a Dequeue stream must be a subscribe")
        sub = await dequeuer.subscribe(first.subscribe.queue, first.subscribe.prefetch, first.subscribe.max_batch)
        async with dequeue_stream.serving(sub, _answers(requests)) as deliveries:
            yield dequeue_pb2.DequeueResponse(
                subscribed=dequeue_pb2.Subscribed(queue=sub.queue, prefetch=sub.prefetch, max_batch=sub.max_batch)
            )
            async for batch in deliveries:
                for response in _responses(batch, sub.max_batch, sub.tag_prefix):
                    yield response

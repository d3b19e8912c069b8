"""DequeueService: protobuf <-> domain only; the work is in services/app/subscription.py.

One stream = one subscription. Outcomes are read concurrently with the deliveries being sent;
when the client half-closes, the server stops delivering and ends the stream, and whatever was
left unanswered goes back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import dequeue_pb2, dequeue_pb2_grpc
from services.app.dequeuer import Dequeuer
from services.app.subscription import DEFAULT_PREFETCH, Delivery, Outcome, Subscription
from services.contract import serde
from services.domain.errors import InvalidArgument

_OUTCOMES = {
    dequeue_pb2.OUTCOME_KIND_SUCCESS: Outcome.SUCCESS,
    dequeue_pb2.OUTCOME_KIND_RETRY: Outcome.RETRY,
    dequeue_pb2.OUTCOME_KIND_REJECT: Outcome.REJECT,
}


def _fill(pb: dequeue_pb2.Delivery, d: Delivery) -> None:
    """Write ``d`` into a message already in place: a message passed to a constructor is copied,
    content included (measured: 236 µs per 100 KB delivery of a batch of 32, 123 µs in place)."""
    pb.delivery_tag, pb.content_inline, pb.redelivered = d.tag, d.content is not None, d.redelivered
    if d.content:
        pb.content = d.content
    pb.mail.CopyFrom(serde.queued_mail_to_proto(d.mail))


def _response(first: Delivery, sub: Subscription) -> dequeue_pb2.DequeueResponse:
    """One delivery alone, or (max_batch above 1) with the others ready now."""
    response = dequeue_pb2.DequeueResponse()
    if sub.max_batch == 1:
        _fill(response.delivery, first)
        return response
    deliveries = response.deliveries.deliveries
    for d in (first, *sub.ready(sub.max_batch - 1)):
        _fill(deliveries.add(), d)
    return response


def _outcomes(request: dequeue_pb2.DequeueRequest) -> list[dequeue_pb2.Outcome]:
    """The outcomes a request carries, each with a kind; raises InvalidArgument before settling any."""
    kind = request.WhichOneof("kind")
    if kind == "outcome":
        outcomes = [request.outcome]
    elif kind == "outcomes" and request.outcomes.outcomes:
        outcomes = list(request.outcomes.outcomes)
    elif kind == "outcomes":
        raise InvalidArgument("an Outcomes message must carry at least one outcome")
    else:
        raise InvalidArgument("only the first message of a Dequeue stream may be a subscribe")
    for o in outcomes:
        if o.kind not in _OUTCOMES:
            raise InvalidArgument(f"outcome for delivery {o.delivery_tag} has no kind: use SUCCESS, RETRY or REJECT")
    return outcomes


async def _settle_outcomes(requests: AsyncIterator[dequeue_pb2.DequeueRequest], sub: Subscription) -> None:
    """Read outcomes until the client half-closes; settle them concurrently; raise the first error."""
    settling: set[asyncio.Task[None]] = set()
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def check(task: asyncio.Task[None]) -> None:
        settling.discard(task)
        if not task.cancelled() and task.exception() is not None and not failed.done():
            failed.set_exception(task.exception())

    async def read() -> None:
        async for request in requests:
            outcomes = _outcomes(request)
            retry_afters = [serde.retry_after_from_proto(o) for o in outcomes]
            for o, retry_after in zip(outcomes, retry_afters):
                task = asyncio.create_task(sub.settle(o.delivery_tag, _OUTCOMES[o.kind], o.error_message, retry_after))
                settling.add(task)
                task.add_done_callback(check)
        if settling:
            await asyncio.wait(set(settling))

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait({reader, failed}, return_when=asyncio.FIRST_COMPLETED)
        if failed.done():
            failed.result()
        reader.result()
        if failed.done():
            failed.result()
    finally:
        reader.cancel()
        for task in settling:
            task.cancel()


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
        outcomes = asyncio.create_task(_settle_outcomes(requests, sub))
        delivery: asyncio.Task[Delivery] | None = None
        try:
            yield dequeue_pb2.DequeueResponse(
                subscribed=dequeue_pb2.Subscribed(queue=sub.queue, prefetch=first.subscribe.prefetch or DEFAULT_PREFETCH,
                                                  max_batch=sub.max_batch)
            )
            while True:
                delivery = asyncio.create_task(sub.next())
                done, _ = await asyncio.wait({delivery, outcomes}, return_when=asyncio.FIRST_COMPLETED)
                if delivery in done:
                    yield _response(delivery.result(), sub)
                    continue
                outcomes.result()  # raises what settling raised; otherwise the client half-closed
                return
        finally:
            for task in (delivery, outcomes):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            # Shielded: a second cancel (the client gone while the stream ends) must not cut the
            # return of what the stream holds, nor leave its consumer channel open.
            await asyncio.shield(sub.close())

"""DequeueService: protobuf <-> domain only; the work is in services/dequeuer.py.

One stream = one subscription. Outcomes are read concurrently with the deliveries being sent;
when the client half-closes, the server stops delivering and ends the stream, and whatever was
left unanswered goes back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from mailqueue.v1 import dequeue_pb2, dequeue_pb2_grpc
from services import serde
from services.dequeuer import Delivery, Outcome, Subscription
from services.errors import InvalidArgument

_OUTCOMES = {
    dequeue_pb2.OUTCOME_KIND_SUCCESS: Outcome.SUCCESS,
    dequeue_pb2.OUTCOME_KIND_RETRY: Outcome.RETRY,
    dequeue_pb2.OUTCOME_KIND_REJECT: Outcome.REJECT,
}


def _delivery(d: Delivery) -> dequeue_pb2.DequeueResponse:
    return dequeue_pb2.DequeueResponse(
        delivery=dequeue_pb2.Delivery(
            delivery_tag=d.tag, mail=serde.queued_mail_to_proto(d.mail), content=d.content or b"",
            content_inline=d.content is not None, redelivered=d.redelivered,
        )
    )


async def _settle_outcomes(requests: AsyncIterator[dequeue_pb2.DequeueRequest], sub: Subscription) -> None:
    async for request in requests:
        if request.WhichOneof("kind") != "outcome":
            raise InvalidArgument("only the first message of a Dequeue stream may be a subscribe")
        o = request.outcome
        if o.kind not in _OUTCOMES:
            raise InvalidArgument(f"outcome for delivery {o.delivery_tag} has no kind: use SUCCESS, RETRY or REJECT")
        await sub.settle(o.delivery_tag, _OUTCOMES[o.kind], o.error_message)


class DequeueServicer(dequeue_pb2_grpc.DequeueServiceServicer):
    def __init__(self, app: Any) -> None:
        self._app = app

    async def Dequeue(
        self, request_iterator: AsyncIterator[dequeue_pb2.DequeueRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dequeue_pb2.DequeueResponse]:
        dequeuer = self._app.dequeuer()
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "subscribe":
            raise InvalidArgument("the first message of a Dequeue stream must be a subscribe")
        sub = await dequeuer.subscribe(first.subscribe.queue, first.subscribe.prefetch)
        outcomes = asyncio.create_task(_settle_outcomes(requests, sub))
        try:
            yield dequeue_pb2.DequeueResponse(
                subscribed=dequeue_pb2.Subscribed(queue=sub.queue, prefetch=first.subscribe.prefetch or 16)
            )
            while True:
                delivery = asyncio.create_task(sub.next())
                done, _ = await asyncio.wait({delivery, outcomes}, return_when=asyncio.FIRST_COMPLETED)
                if delivery in done:
                    yield _delivery(delivery.result())
                    continue
                delivery.cancel()
                outcomes.result()  # raises what settling raised; otherwise the client half-closed
                return
        finally:
            outcomes.cancel()
            with contextlib.suppress(BaseException):
                await outcomes
            await sub.close()

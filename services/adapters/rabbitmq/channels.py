"""pika plumbing under the RabbitMQ broker: the futures that channel calls and publishes wait on.

Contract: every future a channel call or a publish waits on fails with BackendUnavailable when its
channel closes, so nothing above waits for an answer that can no longer come; pika's own errors
never go up the stack. The confirm channel is in publishing.py, the consumer in consuming.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pika
from pika.channel import Channel

from services.domain.errors import BackendUnavailable, FailedPrecondition, MailQueueError

log = logging.getLogger(__name__)


def unavailable(detail: Any) -> BackendUnavailable:
    return BackendUnavailable("rabbitmq", str(detail) or type(detail).__name__)


def consumer_closed(reason: Any) -> MailQueueError:
    """Why a consumer's channel closed, as the consumer's stream ends with it: the broker's
    consumer timeout (a delivery held unanswered too long) is the client's to mend, said so;
    anything else is the broker being unavailable."""
    text = str(reason)
    if "acknowledgement" in text and "timed out" in text:
        return FailedPrecondition(
            "a delivery was not answered within RabbitMQ's consumer timeout (consumer_timeout, 30 min by default): the "
            "stream ended and every delivery it held goes back to the queue; answer each delivery sooner (RETRY with "
            "retry_after what must wait), or raise consumer_timeout on the broker")
    return unavailable(reason or "consumer channel closed")


class Waiters:
    """Futures waiting on one channel: all fail together when the channel closes."""

    def __init__(self, channel: Channel) -> None:
        self.futures: set[asyncio.Future[Any]] = set()
        self.closed_reason: Any = None
        channel.add_on_close_callback(self._on_close)

    def new(self) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        # Its awaiter reads the error; one gone meanwhile (its stream ended) never will: read here,
        # never logged as "Future exception was never retrieved".
        fut.add_done_callback(_read_error)
        if self.closed_reason is not None:
            fut.set_exception(unavailable(self.closed_reason))
            return fut
        self.futures.add(fut)
        fut.add_done_callback(self.futures.discard)
        return fut

    def call(self, send: Callable[[Callable[..., None]], Any]) -> asyncio.Future[Any]:
        """The future of the broker's answer to a channel method: ``send(callback)`` makes the call.
        A channel closed before or as it is called (pika raises then): the future fails with
        BackendUnavailable; never a pika error up the stack, nor a future nobody awaits."""
        fut = self.new()
        if fut.done():
            return fut
        try:
            send(resolver(fut))
        except pika.exceptions.AMQPError as e:
            fut.set_exception(unavailable(e))
        return fut

    def _on_close(self, _channel: Channel, reason: Any) -> None:
        self.closed_reason = reason
        for fut in list(self.futures):
            if not fut.done():
                fut.set_exception(unavailable(reason))


def _read_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def resolver(fut: asyncio.Future[Any]) -> Callable[..., None]:
    def done(*args: Any) -> None:
        if not fut.done():
            fut.set_result(args[0] if args else None)

    return done

"""WatchEvents: the event stream from a cursor, filtered here, on the server (a watcher of one queue
does not receive, nor pay the network for, every other queue's events)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

from prometheus_client import Gauge

from services.domain import event_stream
from services.domain.errors import Rebalanced
from services.domain.event_stream import EventFilter
from services.domain.events import Event
from services.ports.events import EventStream

#: A watch still running this long after its ``lasts_s`` is stuck writing to a client that does not
#: read: it is cancelled (browse_svc/events.py).
STALLED_GRACE_S = 30.0

WATCHERS = Gauge("mailqueue_event_watchers", "WatchEvents calls being served (each holds one stream consumer on RabbitMQ)")


async def watch(
    stream: EventStream, cursor: str, from_oldest: bool, wanted: EventFilter, lasts_s: float | None = None,
) -> AsyncIterator[Event]:
    """The events ``wanted`` from ``cursor`` (that event first, if wanted), else from the oldest
    kept (``from_oldest``), else from the next recorded; until the caller stops iterating, which
    ends the stream's consumer, or for ``lasts_s`` (then Rebalanced: the client watches again,
    from its last cursor, maybe on another replica). A malformed cursor: InvalidArgument, before
    anything is read; one past the stream's last event (a stream declared again since): OutOfRange."""
    event_stream.start(cursor, from_oldest)
    loop = asyncio.get_running_loop()
    ends = None if lasts_s is None else loop.time() + lasts_s
    WATCHERS.inc()
    try:
        async with contextlib.aclosing(stream.watch(cursor or None, from_oldest)) as events:
            while True:
                if ends is not None and loop.time() >= ends:  # a watch with events always queued never waits
                    raise _rebalanced(lasts_s)
                bound = asyncio.timeout_at(ends)  # around the read only: never around a yield
                try:
                    async with bound:
                        e = await anext(events)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not bound.expired():
                        raise
                    raise _rebalanced(lasts_s) from None
                if wanted(e):
                    yield e
    finally:
        WATCHERS.dec()


@contextlib.contextmanager
def ended_if_stalled(events: AsyncGenerator[Event, None], lasts_s: float | None) -> Iterator[None]:
    """Around a call that sends ``events`` (a ``watch``): ``watch`` ends itself after ``lasts_s``,
    but only between two events, and a client that stopped reading (a paused pager) blocks the
    write of the next one for ever, holding its watcher slot and its stream consumer. Past
    ``lasts_s`` and STALLED_GRACE_S, ``events`` is closed (its consumer, its slot: at once, not when
    the collector finds it) and the call's task cancelled (the client sees CANCELLED)."""
    task = asyncio.current_task()
    if lasts_s is None or task is None:
        yield
        return

    def give_up() -> None:
        closing = asyncio.ensure_future(_close(events))
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)
        task.cancel()

    stalled = asyncio.get_running_loop().call_later(lasts_s + STALLED_GRACE_S, give_up)
    try:
        yield
    finally:
        stalled.cancel()


#: The closings under way (a task nobody else holds could be collected before it ran).
_CLOSING: set[asyncio.Future[None]] = set()


async def _close(events: AsyncGenerator[Event, None]) -> None:
    with contextlib.suppress(RuntimeError):  # running, not stalled: it ends by itself
        await events.aclose()


def _rebalanced(lasts_s: float | None) -> Rebalanced:
    return Rebalanced(f"this watch reached its {lasts_s:g} s (MAILQUEUE_MAX_CONNECTION_AGE_S) and ends, so that "
                      f"watchers spread over the replicas: {event_stream.REBALANCED}")

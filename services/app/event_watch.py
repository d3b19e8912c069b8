"""WatchEvents: the event stream from a cursor, filtered here, on the server (a watcher of one queue
does not receive, nor pay the network for, every other queue's events)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

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


def _rebalanced(lasts_s: float | None) -> Rebalanced:
    return Rebalanced(f"this watch reached its {lasts_s:g} s (MAILQUEUE_MAX_CONNECTION_AGE_S) and ends, so that "
                      f"watchers spread over the replicas: {event_stream.REBALANCED}")

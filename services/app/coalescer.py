"""Start concurrent unary calls together, so that their backend writes travel together.

One Enqueue at a time from many connections (how SMTP servers send) reaches the server spread
over time: each call's blob write, row write and publish then leave alone, one request and one
network write each, and the backends pay per request. Calls started in the same event-loop turn
queue their requests together instead: the Cassandra driver and pika send them in one write,
the rows share a group commit, the confirms come back together (EnqueueBatches gets this for
free: its mails arrive together).

Under load (``busy`` calls or more in flight) a call waits until ``size`` calls wait or
``window_s`` has passed since the first of them, then they all start at once. Below that load a
call starts at once: a lone caller pays no wait. Each call still answers on its own, once its
mail is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import Histogram

T = TypeVar("T")

GROUP = Histogram("mailqueue_enqueue_coalesced_calls", "Unary calls started together by the coalescer",
                  buckets=(1, 2, 4, 8, 16, 32, 64))


class Coalescer:
    def __init__(self, window_s: float = 0.002, size: int = 32, busy: int = 8) -> None:
        self.window_s, self.size, self.busy = window_s, size, busy
        self._waiting: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight = 0

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        if self.window_s > 0 and self._in_flight >= self.busy:
            await self._gate()
        self._in_flight += 1
        try:
            return await call()
        finally:
            self._in_flight -= 1

    async def _gate(self) -> None:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        self._waiting.append(opened)
        if len(self._waiting) >= self.size:
            self._open()
        elif self._timer is None:
            self._timer = loop.call_later(self.window_s, self._open)
        try:
            await opened
        except asyncio.CancelledError:
            if opened in self._waiting:
                self._waiting.remove(opened)
            raise

    def _open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        GROUP.observe(len(waiting))
        for f in waiting:
            if not f.done():
                f.set_result(None)

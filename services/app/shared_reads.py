"""Reads shared by the callers that ask for the same thing at the same time: the first starts the
read, the others wait for it (a cached fact found stale by a burst of callers is read once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedReads:
    def __init__(self) -> None:
        self._reading: dict[Hashable, asyncio.Future[Any]] = {}

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``, or the read of ``key`` already under way. Shielded: a caller cancelled does
        not cancel it for the others; its error is raised to each caller."""
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = asyncio.ensure_future(read())
            reading.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(reading)

    def forget(self, key: Hashable) -> None:
        """Callers from now on start a read of their own: the one under way may predate a change."""
        self._reading.pop(key, None)

    def _done(self, key: Hashable, done: asyncio.Future[Any]) -> None:
        if self._reading.get(key) is done:
            del self._reading[key]
        if not done.cancelled():
            done.exception()  # each waiter raises it: never "never retrieved"

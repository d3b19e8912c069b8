"""What enqueue_svc, dequeue_svc and browse_svc share: a service over the three backends.

Each names the domain object it serves (``build``) and its background tasks (``background``);
connecting, checking and closing the backends is done here once.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from services.runtime.backends import Backends
from services.runtime.server import App
from services.runtime.settings import Settings

S = TypeVar("S")


class QueueApp(App, Generic[S]):
    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._backends: Backends | None = None
        self._service: S | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @abc.abstractmethod
    def build(self, backends: Backends) -> S:
        """The domain object the servicers call (an Enqueuer, a Dequeuer, a Browser)."""

    def background(self, backends: Backends) -> list[Coroutine[Any, Any, None]]:
        """Tasks that run while the service is up (cancelled at close)."""
        return []

    async def connect(self) -> None:
        b = await Backends.open(self.settings)
        self._backends = b
        self._service = self.build(b)
        self._tasks = [asyncio.create_task(c) for c in self.background(b)]

    async def check(self) -> None:
        assert self._backends is not None
        await self._backends.check()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._backends is not None:
            await self._backends.close()

    def backends(self) -> Backends:
        self.require_connected()
        assert self._backends is not None
        return self._backends

    def service(self) -> S:
        self.require_connected()
        assert self._service is not None
        return self._service

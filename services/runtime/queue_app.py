"""What enqueue_svc, dequeue_svc and browse_svc share: a service over the three backends.

Each names the domain object it serves (``build``) and its background tasks (``background``);
connecting, checking and closing the backends is done here once.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from services.domain.errors import BackendUnavailable
from services.runtime.backends import Backends
from services.runtime.server import App
from services.runtime.settings import Settings

S = TypeVar("S")

log = logging.getLogger(__name__)


class QueueApp(App, Generic[S]):
    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._backends: Backends | None = None
        self._service: S | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: The background task that ended by an error, and its error (readiness fails from then on).
        self._died: str | None = None

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
        for task in self._tasks:
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A background task that ends by an error (they retry what an outage raises: this is a
        bug, or a state they cannot leave) is logged, and fails readiness from then on: left
        silent, the dead-letter recorder or the healer stopped for the life of the process."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self._died = f"{task.get_coro().__qualname__ if task.get_coro() else task.get_name()}: {type(error).__name__}: {error}"[:500]
        log.error("a background task of the service died: restart the process", extra={"task": self._died}, exc_info=error)

    async def check(self) -> None:
        assert self._backends is not None
        if self._died is not None:
            raise BackendUnavailable(self.name, f"a background task died ({self._died}): restart the process")
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

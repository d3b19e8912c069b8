"""dequeue_svc's backends: view, broker and blob_svc."""

from __future__ import annotations

import asyncio
from typing import Any

from dequeue_svc.servicer import DequeueServicer
from mailqueue.v1 import dequeue_pb2_grpc
from services import dead_letters
from services.backends import Backends
from services.dequeuer import Dequeuer
from services.runtime.server import App


class DequeueApp(App):
    name = "dequeue"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._backends: Backends | None = None
        self._dequeuer: Dequeuer | None = None
        self._marker: asyncio.Task[None] | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(dequeue_pb2_grpc.add_DequeueServiceServicer_to_server, DequeueServicer(self), "mailqueue.v1.DequeueService")]

    async def connect(self) -> None:
        b = await Backends.open(self.settings)
        self._backends = b
        self._dequeuer = Dequeuer(b.view, b.broker, b.blobs, self.settings.limits, b.state)
        self._marker = asyncio.create_task(dead_letters.mark_forever(b.view, b.broker))

    async def check(self) -> None:
        assert self._backends is not None
        await self._backends.check()

    async def close(self) -> None:
        if self._marker is not None:
            self._marker.cancel()
        if self._backends is not None:
            await self._backends.close()

    def dequeuer(self) -> Dequeuer:
        self.require_connected()
        assert self._dequeuer is not None
        return self._dequeuer

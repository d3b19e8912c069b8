"""enqueue_svc's backends: view, broker and blob_svc, wired into an Enqueuer."""

from __future__ import annotations

from typing import Any

from enqueue_svc.servicer import EnqueueServicer
from mailqueue.v1 import enqueue_pb2_grpc
from services.backends import Backends
from services.enqueuer import Enqueuer
from services.runtime.server import App


class EnqueueApp(App):
    name = "enqueue"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._backends: Backends | None = None
        self._enqueuer: Enqueuer | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(enqueue_pb2_grpc.add_EnqueueServiceServicer_to_server, EnqueueServicer(self), "mailqueue.v1.EnqueueService")]

    async def connect(self) -> None:
        b = await Backends.open(self.settings)
        self._backends = b
        self._enqueuer = Enqueuer(b.view, b.broker, b.blobs, self.settings.limits, b.state)

    async def check(self) -> None:
        assert self._backends is not None
        await self._backends.check()

    async def close(self) -> None:
        if self._backends is not None:
            await self._backends.close()

    def enqueuer(self) -> Enqueuer:
        self.require_connected()
        assert self._enqueuer is not None
        return self._enqueuer

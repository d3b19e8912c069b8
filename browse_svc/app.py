"""browse_svc's backends: view, broker and blob_svc."""

from __future__ import annotations

import asyncio
from typing import Any

from browse_svc.servicer import AdminServicer, BrowseServicer
from mailqueue.v1 import admin_pb2_grpc, browse_pb2_grpc
from services import gauges
from services.backends import Backends
from services.browser import Browser
from services.runtime.server import App


class BrowseApp(App):
    name = "browse"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._backends: Backends | None = None
        self._browser: Browser | None = None
        self._gauges: asyncio.Task[None] | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [
            (browse_pb2_grpc.add_BrowseServiceServicer_to_server, BrowseServicer(self), "mailqueue.v1.BrowseService"),
            (admin_pb2_grpc.add_AdminServiceServicer_to_server, AdminServicer(self), "mailqueue.v1.AdminService"),
        ]

    async def connect(self) -> None:
        b = await Backends.open(self.settings)
        self._backends = b
        self._browser = Browser(b.view, b.broker)
        interval = self.settings.server.gauge_interval_s
        if interval:
            self._gauges = asyncio.create_task(gauges.refresh_forever(b.view, b.broker, interval))

    async def check(self) -> None:
        assert self._backends is not None
        await self._backends.check()

    async def close(self) -> None:
        if self._gauges is not None:
            self._gauges.cancel()
        if self._backends is not None:
            await self._backends.close()

    def backends(self) -> Backends:
        self.require_connected()
        assert self._backends is not None
        return self._backends

    def browser(self) -> Browser:
        self.require_connected()
        assert self._browser is not None
        return self._browser

"""browse_svc: a Browser over the view and the broker (browse and admin), and the queue gauges."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from browse_svc.servicer import AdminServicer, BrowseServicer
from mailqueue.v1 import admin_pb2_grpc, browse_pb2_grpc
from services.app import gauges
from services.app.browser import Browser
from services.runtime.backends import Backends
from services.runtime.queue_app import QueueApp


class BrowseApp(QueueApp[Browser]):
    name = "browse"

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [
            (browse_pb2_grpc.add_BrowseServiceServicer_to_server,
             BrowseServicer(self.backends, self.service, self.settings.limits.dequeue_inline_bytes), "mailqueue.v1.BrowseService"),
            (admin_pb2_grpc.add_AdminServiceServicer_to_server, AdminServicer(self.backends, self.service), "mailqueue.v1.AdminService"),
        ]

    def build(self, b: Backends) -> Browser:
        return Browser(b.view, b.broker)

    def background(self, b: Backends) -> list[Coroutine[Any, Any, None]]:
        interval = self.settings.server.gauge_interval_s
        return [gauges.refresh_forever(b.view, b.broker, interval)] if interval else []

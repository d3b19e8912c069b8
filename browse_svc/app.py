"""browse_svc: the read side (a Browser) and the admin side (an Admin) over the view and the
broker, the operators' work on dead letters (a DeadLetterAdmin), the event stream (WatchEvents),
the queue gauges and the healer."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Coroutine
from typing import Any

from browse_svc.events import EventServicer
from browse_svc.servicer import AdminServicer, BrowseServicer
from browse_svc.webhooks import WebhookAdminServicer
from mailqueue.v1 import admin_pb2_grpc, browse_pb2_grpc, events_pb2_grpc, webhooks_pb2_grpc
from services.app import gauges
from services.app.admin import Admin
from services.app.browser import Browser
from services.app.dead_letter_admin import DeadLetterAdmin
from services.app.healer import Healer
from services.app.history import History
from services.app.quota_admin import QuotaAdmin
from services.app.shaping_admin import ShapingAdmin
from services.app.webhook_admin import WebhookAdmin
from services.domain.errors import BackendUnavailable
from services.runtime.backends import Backends
from services.runtime.queue_app import QueueApp
from services.runtime.webhooks import webhook_admin

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BrowseSide:
    browser: Browser
    admin: Admin
    shaping: ShapingAdmin
    dead_letters: DeadLetterAdmin
    history: History
    webhooks: WebhookAdmin
    quotas: QuotaAdmin


class BrowseApp(QueueApp[BrowseSide]):
    name = "browse"
    #: Its calls go on past their connection's age for as long as they last: an operator's redrive,
    #: clear or move of a deep queue is one call (cut at 330 s before: about 33,000 dead letters at
    #: 100/s). WatchEvents, the one call that would never end, ends itself at the connection age.
    connection_age_grace_s = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [
            (browse_pb2_grpc.add_BrowseServiceServicer_to_server, BrowseServicer(lambda: self.service().browser, lambda: self.service().dead_letters),
             "mailqueue.v1.BrowseService"),
            (admin_pb2_grpc.add_AdminServiceServicer_to_server,
             AdminServicer(lambda: self.service().admin, lambda: self.service().shaping, lambda: self.service().dead_letters,
                           lambda: self.service().quotas),
             "mailqueue.v1.AdminService"),
            (events_pb2_grpc.add_EventServiceServicer_to_server,
             EventServicer(lambda: self.service().history, lambda: self.backends().stream, self.settings.server.max_connection_age_s),
             "mailqueue.v1.EventService"),
            (webhooks_pb2_grpc.add_WebhookAdminServiceServicer_to_server, WebhookAdminServicer(lambda: self.service().webhooks),
             "mailqueue.v1.WebhookAdminService"),
        ]

    async def connect(self) -> None:
        await super().connect()
        assert self._backends is not None
        try:
            await self._backends.stream.declare()  # the stream it serves exists from start-up on
        except BackendUnavailable as e:
            log.warning("the event stream is not declared yet (WatchEvents declares it): %s", e)

    def build(self, b: Backends) -> BrowseSide:
        browser = Browser(b.view, b.broker, b.blobs, b.state, self.settings.limits.dequeue_inline_bytes)
        admin = Admin(b.view, b.broker, b.state, browser, b.events)
        dead_letters = DeadLetterAdmin(b.view, b.broker, browser, admin.mover, b.events)
        admin.complete_redrives = dead_letters.complete_interrupted
        return BrowseSide(browser, admin, ShapingAdmin(b.view.shaping, b.state, b.events), dead_letters,
                          History(b.events), webhook_admin(b.view, self.settings.cassandra.keyspace, b.events),
                          QuotaAdmin(b.view.quotas, b.state, b.events))

    def background(self, b: Backends) -> list[Coroutine[Any, Any, None]]:
        server = self.settings.server
        side = self._service  # built just before (service() answers only once connected)
        assert side is not None
        tasks = [gauges.refresh_forever(b.view, side.browser.head, server.gauge_interval_s)] if server.gauge_interval_s else []
        if server.heal_interval_s:
            healer = Healer(b.view, b.broker, side.browser.live_mails, side.admin.mover, side.dead_letters,
                            server.heal_interval_s, server.heal_grace_s, server.heal_rows_per_round, events=b.events)
            tasks.append(healer.run_forever())
        return tasks

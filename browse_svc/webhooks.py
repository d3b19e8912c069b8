"""WebhookAdminService: protobuf <-> domain only; the work is in services/app/webhook_admin.py."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from mailqueue.v1 import webhooks_pb2, webhooks_pb2_grpc
from services.app.webhook_admin import WebhookAdmin
from services.contract import webhooks_serde as s
from services.domain.errors import InvalidArgument


class WebhookAdminServicer(webhooks_pb2_grpc.WebhookAdminServiceServicer):
    def __init__(self, admin: Callable[[], WebhookAdmin]) -> None:
        self._admin = admin

    async def AddWebhook(self, request: webhooks_pb2.AddWebhookRequest, context: grpc.aio.ServicerContext) -> webhooks_pb2.AddWebhookResponse:
        if not request.HasField("webhook"):
            raise InvalidArgument("webhook is missing")
        wanted = s.webhook_from_proto(request.webhook)  # read before the backends are asked
        added = await self._admin().add(wanted)
        return webhooks_pb2.AddWebhookResponse(webhook=s.webhook_to_proto(added))

    async def ListWebhooks(
        self, request: webhooks_pb2.ListWebhooksRequest, context: grpc.aio.ServicerContext,
    ) -> webhooks_pb2.ListWebhooksResponse:
        return webhooks_pb2.ListWebhooksResponse(webhooks=[s.webhook_to_proto(r) for r in await self._admin().list()])

    async def RemoveWebhook(
        self, request: webhooks_pb2.RemoveWebhookRequest, context: grpc.aio.ServicerContext,
    ) -> webhooks_pb2.RemoveWebhookResponse:
        return webhooks_pb2.RemoveWebhookResponse(webhook=s.webhook_to_proto(await self._admin().remove(request.name)))

"""BrowseService and AdminService: protobuf <-> domain only.

Implemented so far: ListQueues, CreateQueue, GetConfiguration, UpdateConfiguration. The other
RPCs answer UNIMPLEMENTED until the browse/admin work lands.
"""

from __future__ import annotations

from typing import Any

import grpc

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc
from services import serde
from services.errors import InvalidArgument
from services.queues import create_queue


class BrowseServicer(browse_pb2_grpc.BrowseServiceServicer):
    def __init__(self, app: Any) -> None:
        self._app = app

    async def ListQueues(self, request: browse_pb2.ListQueuesRequest, context: grpc.aio.ServicerContext) -> browse_pb2.ListQueuesResponse:
        return browse_pb2.ListQueuesResponse(queues=await self._app.backends().view.queues.all())


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, app: Any) -> None:
        self._app = app

    async def CreateQueue(self, request: admin_pb2.CreateQueueRequest, context: grpc.aio.ServicerContext) -> admin_pb2.CreateQueueResponse:
        b = self._app.backends()
        return admin_pb2.CreateQueueResponse(created=await create_queue(b.view, b.broker, request.queue))

    async def GetConfiguration(
        self, request: admin_pb2.GetConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetConfigurationResponse:
        config = await self._app.backends().view.config.current()
        return admin_pb2.GetConfigurationResponse(configuration=serde.view_config_to_proto(config))

    async def UpdateConfiguration(
        self, request: admin_pb2.UpdateConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateConfigurationResponse:
        if not request.HasField("configuration"):
            raise InvalidArgument("configuration is missing")
        b = self._app.backends()
        config = await b.view.config.apply(serde.view_config_from_proto(request.configuration))
        b.state.forget_config()
        return admin_pb2.UpdateConfigurationResponse(configuration=serde.view_config_to_proto(config))

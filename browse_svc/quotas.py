"""AdminService's enqueue quota RPCs: protobuf <-> domain only; the work is in
services/app/quota_admin.py."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from mailqueue.v1 import admin_pb2, quotas_pb2
from services.app.quota_admin import QuotaAdmin
from services.contract import quotas_serde as s
from services.domain.errors import InvalidArgument


class QuotaServicer:
    _quotas: Callable[[], QuotaAdmin]

    async def SetQuota(self, request: admin_pb2.SetQuotaRequest, context: grpc.aio.ServicerContext) -> admin_pb2.SetQuotaResponse:
        if not request.HasField("quota"):
            raise InvalidArgument("quota is missing")
        wanted = s.quota_from_proto(request.quota)  # refused before the backends are asked (down: UNAVAILABLE)
        q = await self._quotas().set_quota(wanted)
        return admin_pb2.SetQuotaResponse(quota=s.quota_to_proto(q))

    async def ClearQuota(self, request: admin_pb2.ClearQuotaRequest, context: grpc.aio.ServicerContext) -> admin_pb2.ClearQuotaResponse:
        kind = s.kind_from_proto(request.kind)
        cleared = await self._quotas().clear_quota(kind, request.subject)
        return admin_pb2.ClearQuotaResponse(cleared=cleared)

    async def ListQuotas(self, request: admin_pb2.ListQuotasRequest, context: grpc.aio.ServicerContext) -> admin_pb2.ListQuotasResponse:
        kind = s.kind_from_proto(request.kind) if request.kind != quotas_pb2.QUOTA_KIND_UNSPECIFIED else ""
        found, members = await self._quotas().listing(kind)
        return admin_pb2.ListQuotasResponse(quotas=[s.quota_to_proto(q) for q in found], members=members)

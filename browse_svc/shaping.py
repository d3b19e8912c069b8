"""AdminService's traffic shaping RPCs: protobuf <-> domain only; the work is in
services/app/shaping_admin.py."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from mailqueue.v1 import admin_pb2
from services.app.shaping_admin import ShapingAdmin
from services.contract import shaping_serde as s
from services.domain.errors import InvalidArgument


def _required(request: object, field: str) -> None:
    if not request.HasField(field):  # type: ignore[attr-defined]
        raise InvalidArgument(f"{field} is missing")


class ShapingServicer:
    _shaping: Callable[[], ShapingAdmin]

    async def SetThrottle(self, request: admin_pb2.SetThrottleRequest, context: grpc.aio.ServicerContext) -> admin_pb2.SetThrottleResponse:
        _required(request, "throttle")
        wanted = s.throttle_from_proto(request.throttle)  # read before the backends are asked
        t = await self._shaping().set_throttle(wanted)
        return admin_pb2.SetThrottleResponse(throttle=s.throttle_to_proto(t))

    async def ClearThrottle(
        self, request: admin_pb2.ClearThrottleRequest, context: grpc.aio.ServicerContext,
    ) -> admin_pb2.ClearThrottleResponse:
        return admin_pb2.ClearThrottleResponse(cleared=await self._shaping().clear_throttle(request.queue, request.destination))

    async def ListThrottles(
        self, request: admin_pb2.ListThrottlesRequest, context: grpc.aio.ServicerContext,
    ) -> admin_pb2.ListThrottlesResponse:
        listing = await self._shaping().listing(request.queue)
        return admin_pb2.ListThrottlesResponse(
            throttles=[s.throttle_to_proto(t) for t in listing.throttles], sites=[s.site_to_proto(x) for x in listing.sites],
            rules=[s.rule_to_proto(r) for r in listing.rules], effects=[s.effect_to_proto(e, r) for e, r in listing.effects],
            destinations=[s.status_to_proto(d) for d in listing.destinations], members=listing.members,
        )

    async def SetSite(self, request: admin_pb2.SetSiteRequest, context: grpc.aio.ServicerContext) -> admin_pb2.SetSiteResponse:
        _required(request, "site")
        wanted = s.site_from_proto(request.site)  # read before the backends are asked
        return admin_pb2.SetSiteResponse(site=s.site_to_proto(await self._shaping().set_site(wanted)))

    async def DeleteSite(self, request: admin_pb2.DeleteSiteRequest, context: grpc.aio.ServicerContext) -> admin_pb2.DeleteSiteResponse:
        return admin_pb2.DeleteSiteResponse(deleted=await self._shaping().delete_site(request.name))

    async def SetShapingRule(
        self, request: admin_pb2.SetShapingRuleRequest, context: grpc.aio.ServicerContext,
    ) -> admin_pb2.SetShapingRuleResponse:
        _required(request, "rule")
        wanted = s.rule_from_proto(request.rule)  # read before the backends are asked
        rule = await self._shaping().set_rule(wanted)
        return admin_pb2.SetShapingRuleResponse(rule=s.rule_to_proto(rule))

    async def DeleteShapingRule(
        self, request: admin_pb2.DeleteShapingRuleRequest, context: grpc.aio.ServicerContext,
    ) -> admin_pb2.DeleteShapingRuleResponse:
        return admin_pb2.DeleteShapingRuleResponse(deleted=await self._shaping().delete_rule(request.rule_id))

    async def LiftEffect(self, request: admin_pb2.LiftEffectRequest, context: grpc.aio.ServicerContext) -> admin_pb2.LiftEffectResponse:
        return admin_pb2.LiftEffectResponse(lifted=await self._shaping().lift_effect(request.destination))

"""BrowseService and AdminService: protobuf <-> domain only; the work is in services/app/browser.py
(read) and services/app/admin.py (admin); their dead-letter RPCs are in browse_svc/dead_letters.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from browse_svc.dead_letters import DeadLetterAdminServicer, DeadLetterBrowseServicer
from browse_svc.quotas import QuotaServicer
from browse_svc.shaping import ShapingServicer
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc
from services.app.admin import Admin
from services.app.browser import Browser
from services.app.dead_letter_admin import DeadLetterAdmin
from services.app.quota_admin import QuotaAdmin
from services.app.shaping_admin import ShapingAdmin
from services.contract import serde, shaping_serde
from services.domain import model, rules
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter, flush_condition


class BrowseServicer(DeadLetterBrowseServicer, browse_pb2_grpc.BrowseServiceServicer):
    def __init__(self, browser: Callable[[], Browser], dead_letters: Callable[[], DeadLetterAdmin]) -> None:
        self._browser = browser  # raises UNAVAILABLE while the service connects
        self._dead_letters = dead_letters

    async def ListQueues(self, request: browse_pb2.ListQueuesRequest, context: grpc.aio.ServicerContext) -> browse_pb2.ListQueuesResponse:
        return browse_pb2.ListQueuesResponse(queues=await self._browser().queues())

    async def GetQueue(self, request: browse_pb2.GetQueueRequest, context: grpc.aio.ServicerContext) -> browse_pb2.GetQueueResponse:
        browser = self._browser()
        info = await browser.info(await browser.existing(request.queue), request.exact)
        pb = serde.queue_info_to_proto(info)
        pb.throttles.extend(shaping_serde.throttle_to_proto(t) for t in info.throttles)
        return browse_pb2.GetQueueResponse(queue_info=pb)

    async def Browse(
        self, request: browse_pb2.BrowseRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[browse_pb2.BrowseResponse]:
        f = serde.browse_filter_from_proto(request, model.utcnow())
        async for m in self._browser().browse_with_content(request.queue, f, request.limit, request.include_content,
                                                           request.page_size, request.page_token):
            response = browse_pb2.BrowseResponse(mail=serde.queued_mail_to_proto(m.mail), next_page_token=m.next_page_token,
                                                  content_missing=m.content_missing)
            if m.content is not None:
                response.content = m.content
            yield response

    async def GetSize(self, request: browse_pb2.GetSizeRequest, context: grpc.aio.ServicerContext) -> browse_pb2.GetSizeResponse:
        browser = self._browser()
        queue = await browser.existing(request.queue)
        size = await browser.size(queue) if request.exact else await browser.approximate_size(queue)
        return browse_pb2.GetSizeResponse(size=size)


class AdminServicer(ShapingServicer, QuotaServicer, DeadLetterAdminServicer, admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, admin: Callable[[], Admin], shaping: Callable[[], ShapingAdmin], dead_letters: Callable[[], DeadLetterAdmin],
                 quotas: Callable[[], QuotaAdmin]) -> None:
        self._admin = admin  # raises UNAVAILABLE while the service connects
        self._shaping = shaping
        self._quotas = quotas
        self._dead_letters = dead_letters

    async def CreateQueue(self, request: admin_pb2.CreateQueueRequest, context: grpc.aio.ServicerContext) -> admin_pb2.CreateQueueResponse:
        policy = serde.retry_policy_from_proto(request.retry_policy, model.RetryPolicy()) if request.HasField("retry_policy") else None
        return admin_pb2.CreateQueueResponse(created=await self._admin().create_queue(request.queue, policy))

    async def DeleteQueue(
        self, request: admin_pb2.DeleteQueueRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.DeleteQueueResponse]:
        async for p in self._admin().drop_queue(request.queue, request.force):
            yield admin_pb2.DeleteQueueResponse(phase=p.phase, mails_deleted=p.deleted, done=p.done,
                                                 dead_letters_purged=p.dead_letters_purged)

    async def MoveMails(
        self, request: admin_pb2.MoveMailsRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.MoveMailsResponse]:
        f = serde.move_filter_from_proto(request, model.utcnow())
        async for p in self._admin().move(request.queue, request.to_queue, f, request.limit):
            yield admin_pb2.MoveMailsResponse(scanned=p.scanned, moved=p.moved, resumed=p.resumed, done=p.done)

    async def DeleteMails(
        self, request: admin_pb2.DeleteMailsRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.DeleteMailsResponse]:
        async for p in self._admin().delete(request.queue, serde.delete_condition_from_proto(request)):
            yield admin_pb2.DeleteMailsResponse(progress=serde.progress_to_proto(p))

    async def ClearQueue(
        self, request: admin_pb2.ClearQueueRequest, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[admin_pb2.ClearQueueResponse]:
        async for p in self._admin().delete(request.queue, BrowseFilter(), cleared=True):
            yield admin_pb2.ClearQueueResponse(progress=serde.progress_to_proto(p))

    async def Flush(self, request: admin_pb2.FlushRequest, context: grpc.aio.ServicerContext) -> admin_pb2.FlushResponse:
        kind = request.WhichOneof("condition")
        f = flush_condition(**({kind: getattr(request, kind)} if kind else {}))
        return admin_pb2.FlushResponse(flushed=await self._admin().flush(request.queue, f))

    async def RepublishNotProcessed(
        self, request: admin_pb2.RepublishNotProcessedRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RepublishNotProcessedResponse:
        if not request.HasField("older_than"):  # unset would read as 0: every live mail published again
            raise InvalidArgument("older_than is required: only live mails enqueued longer ago than it are published "
                                  "again (0s: every live mail)")
        older_than = serde.duration_from_proto(request.older_than, "older_than")  # read before the backends are asked
        count = await self._admin().republish(request.queue, older_than)
        return admin_pb2.RepublishNotProcessedResponse(republished=count)

    async def UpdateBrowseStart(
        self, request: admin_pb2.UpdateBrowseStartRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateBrowseStartResponse:
        start = await self._admin().update_browse_start(request.queue)
        response = admin_pb2.UpdateBrowseStartResponse()
        if start is not None:
            response.browse_start.CopyFrom(serde.timestamp_to_proto(start))
        return response

    async def GetConfiguration(
        self, request: admin_pb2.GetConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetConfigurationResponse:
        return admin_pb2.GetConfigurationResponse(configuration=serde.view_config_to_proto(await self._admin().configuration()))

    async def UpdateConfiguration(
        self, request: admin_pb2.UpdateConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateConfigurationResponse:
        if not request.HasField("configuration"):
            raise InvalidArgument("configuration is missing")
        wanted = serde.view_config_from_proto(request.configuration)  # read before the backends are asked
        config = await self._admin().update_configuration(wanted)
        return admin_pb2.UpdateConfigurationResponse(configuration=serde.view_config_to_proto(config))

    async def AddRule(self, request: admin_pb2.AddRuleRequest, context: grpc.aio.ServicerContext) -> admin_pb2.AddRuleResponse:
        now = model.utcnow()
        wanted = rules.validate(serde.rule_from_proto(request.rule, now), now)  # checked before the backends are asked
        rule, applied = await self._admin().add_rule(wanted)
        return admin_pb2.AddRuleResponse(rule=serde.rule_to_proto(rule), applied=applied)

    async def ListRules(self, request: admin_pb2.ListRulesRequest, context: grpc.aio.ServicerContext) -> admin_pb2.ListRulesResponse:
        return admin_pb2.ListRulesResponse(rules=[serde.rule_to_proto(r) for r in await self._admin().rules()])

    async def LiftRule(self, request: admin_pb2.LiftRuleRequest, context: grpc.aio.ServicerContext) -> admin_pb2.LiftRuleResponse:
        return admin_pb2.LiftRuleResponse(released=await self._admin().lift_rule(rules.parse_id(request.rule_id)))

    async def ReconcileCounters(
        self, request: admin_pb2.ReconcileCountersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ReconcileCountersResponse:
        before, after = await self._admin().reconcile(request.queue)
        await self._dead_letters().reconcile(request.queue)
        return serde.reconcile_to_proto(before, after)

    async def UpdateRetryPolicy(
        self, request: admin_pb2.UpdateRetryPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateRetryPolicyResponse:
        policy = await self._admin().update_retry_policy(
            request.queue, lambda current: serde.retry_policy_from_proto(request.retry_policy, current))
        return admin_pb2.UpdateRetryPolicyResponse(retry_policy=serde.retry_policy_to_proto(policy))

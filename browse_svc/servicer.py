"""BrowseService and AdminService: protobuf <-> domain only; the work is in services/app/browser.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc
from services.app import browse_start, rule_admin
from services.app.browser import BrowseFilter, Browser, Progress, delete_condition, flush_condition
from services.app.queues import create_queue
from services.contract import serde
from services.domain import model, rules, schedule, validation
from services.domain.errors import InvalidArgument
from services.runtime.backends import Backends


async def _existing_queue(b: Backends, queue: str) -> str:
    validation.queue_name(queue)
    await b.state.require_queue(queue)
    return queue


_SCHEDULES = {browse_pb2.SCHEDULE_FILTER_READY: "ready", browse_pb2.SCHEDULE_FILTER_DELAYED: "delayed"}


def _progress(p: Progress) -> admin_pb2.DeleteProgress:
    return admin_pb2.DeleteProgress(scanned=p.scanned, deleted=p.deleted, done=p.done)


class BrowseServicer(browse_pb2_grpc.BrowseServiceServicer):
    def __init__(self, backends: Callable[[], Backends], browser: Callable[[], Browser], inline_limit: int) -> None:
        self._backends = backends  # both raise UNAVAILABLE while the service connects
        self._browser = browser
        self._inline_limit = inline_limit

    async def ListQueues(self, request: browse_pb2.ListQueuesRequest, context: grpc.aio.ServicerContext) -> browse_pb2.ListQueuesResponse:
        return browse_pb2.ListQueuesResponse(queues=await self._backends().view.queues.all())

    async def GetQueue(self, request: browse_pb2.GetQueueRequest, context: grpc.aio.ServicerContext) -> browse_pb2.GetQueueResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        return browse_pb2.GetQueueResponse(queue_info=serde.queue_info_to_proto(await self._browser().info(queue, request.exact)))

    async def Browse(self, request: browse_pb2.BrowseRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[browse_pb2.BrowseResponse]:
        queue = await _existing_queue(self._backends(), request.queue)
        f = BrowseFilter(
            sender=request.sender or None, recipient=request.recipient or None, name=request.name or None,
            enqueued_after=serde.timestamp_from_proto(request.enqueued_after, "enqueued_after") if request.HasField("enqueued_after") else None,
            enqueued_before=serde.timestamp_from_proto(request.enqueued_before, "enqueued_before") if request.HasField("enqueued_before") else None,
            schedule=_SCHEDULES.get(request.schedule), now=model.utcnow(),
        )
        if request.schedule not in _SCHEDULES and request.schedule != browse_pb2.SCHEDULE_FILTER_UNSPECIFIED:
            raise InvalidArgument(f"schedule filter {request.schedule} is unknown: use READY or DELAYED")
        b = self._backends()
        inline_limit = self._inline_limit
        async for q in self._browser().browse(queue, f, request.limit):
            response = browse_pb2.BrowseResponse(mail=serde.queued_mail_to_proto(q))
            if request.include_content and q.size <= inline_limit:
                response.content = await b.blobs.read(q.blob_ids)
            yield response

    async def GetSize(self, request: browse_pb2.GetSizeRequest, context: grpc.aio.ServicerContext) -> browse_pb2.GetSizeResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        browser = self._browser()
        size = await browser.size(queue) if request.exact else (await browser.approximate_summary(queue)).size
        return browse_pb2.GetSizeResponse(size=size)


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, backends: Callable[[], Backends], browser: Callable[[], Browser]) -> None:
        self._backends = backends  # both raise UNAVAILABLE while the service connects
        self._browser = browser

    async def CreateQueue(self, request: admin_pb2.CreateQueueRequest, context: grpc.aio.ServicerContext) -> admin_pb2.CreateQueueResponse:
        b = self._backends()
        policy = None
        if request.HasField("retry_policy"):
            policy = serde.retry_policy_from_proto(request.retry_policy, model.RetryPolicy())
        return admin_pb2.CreateQueueResponse(created=await create_queue(b.view, b.broker, request.queue, policy))

    async def DeleteMails(self, request: admin_pb2.DeleteMailsRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.DeleteMailsResponse]:
        queue = await _existing_queue(self._backends(), request.queue)
        kind = request.WhichOneof("condition")
        if kind is None:
            raise InvalidArgument("a delete needs exactly one condition: name, sender or recipient")
        value = getattr(request, kind)
        f = delete_condition(**{k: (value if k == kind else None) for k in ("name", "sender", "recipient")})
        async for p in self._browser().delete(queue, f):
            yield admin_pb2.DeleteMailsResponse(progress=_progress(p))

    async def ClearQueue(self, request: admin_pb2.ClearQueueRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.ClearQueueResponse]:
        queue = await _existing_queue(self._backends(), request.queue)
        async for p in self._browser().delete(queue, BrowseFilter()):
            yield admin_pb2.ClearQueueResponse(progress=_progress(p))

    async def Flush(self, request: admin_pb2.FlushRequest, context: grpc.aio.ServicerContext) -> admin_pb2.FlushResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        kind = request.WhichOneof("condition")
        f = flush_condition(**({kind: getattr(request, kind)} if kind else {}))
        return admin_pb2.FlushResponse(flushed=await self._browser().flush(queue, f))

    async def RepublishNotProcessed(
        self, request: admin_pb2.RepublishNotProcessedRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RepublishNotProcessedResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        count = await self._browser().republish(queue, serde.duration_from_proto(request.older_than, "older_than"))
        return admin_pb2.RepublishNotProcessedResponse(republished=count)

    async def UpdateBrowseStart(
        self, request: admin_pb2.UpdateBrowseStartRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateBrowseStartResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        start = await browse_start.update(self._backends().view, queue)
        response = admin_pb2.UpdateBrowseStartResponse()
        if start is not None:
            response.browse_start.CopyFrom(serde.timestamp_to_proto(start))
        return response

    async def GetConfiguration(
        self, request: admin_pb2.GetConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetConfigurationResponse:
        config = await self._backends().view.config.current()
        return admin_pb2.GetConfigurationResponse(configuration=serde.view_config_to_proto(config))

    async def UpdateConfiguration(
        self, request: admin_pb2.UpdateConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateConfigurationResponse:
        if not request.HasField("configuration"):
            raise InvalidArgument("configuration is missing")
        b = self._backends()
        config = await b.view.config.apply(serde.view_config_from_proto(request.configuration))
        b.state.forget_config()
        return admin_pb2.UpdateConfigurationResponse(configuration=serde.view_config_to_proto(config))

    async def AddRule(self, request: admin_pb2.AddRuleRequest, context: grpc.aio.ServicerContext) -> admin_pb2.AddRuleResponse:
        b = self._backends()
        rule, applied = await rule_admin.add(b.view, self._browser(), serde.rule_from_proto(request.rule, model.utcnow()))
        return admin_pb2.AddRuleResponse(rule=serde.rule_to_proto(rule), applied=applied)

    async def ListRules(self, request: admin_pb2.ListRulesRequest, context: grpc.aio.ServicerContext) -> admin_pb2.ListRulesResponse:
        found = await self._backends().view.rules.all()
        return admin_pb2.ListRulesResponse(rules=[serde.rule_to_proto(r) for r in found])

    async def LiftRule(self, request: admin_pb2.LiftRuleRequest, context: grpc.aio.ServicerContext) -> admin_pb2.LiftRuleResponse:
        released = await rule_admin.lift(self._backends().view, self._browser(), rules.parse_id(request.rule_id))
        return admin_pb2.LiftRuleResponse(released=released)

    async def ReconcileCounters(
        self, request: admin_pb2.ReconcileCountersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ReconcileCountersResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        before, after = await self._browser().reconcile(queue)
        return admin_pb2.ReconcileCountersResponse(
            size_before=before.size, delayed_before=before.delayed, held_before=before.held,
            size_after=after.size, delayed_after=after.delayed, held_after=after.held,
        )

    async def UpdateRetryPolicy(
        self, request: admin_pb2.UpdateRetryPolicyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.UpdateRetryPolicyResponse:
        queue = await _existing_queue(self._backends(), request.queue)
        b = self._backends()
        policy = schedule.validate(serde.retry_policy_from_proto(request.retry_policy, await b.view.retry_policies.get(queue)))
        await b.view.retry_policies.set(queue, policy)
        b.state.forget_retry_policy(queue)
        return admin_pb2.UpdateRetryPolicyResponse(retry_policy=serde.retry_policy_to_proto(policy))

"""enqueue_svc: an Enqueuer over the view, the broker and the blob store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from enqueue_svc.servicer import EnqueueServicer
from mailqueue.v1 import enqueue_pb2_grpc
from services.app.enqueuer import Enqueuer
from services.app.quota_keeper import QuotaKeeper
from services.domain import quotas
from services.domain.errors import BackendUnavailable
from services.runtime.backends import Backends
from services.runtime.queue_app import QueueApp

log = logging.getLogger(__name__)

#: The health name that says whether RabbitMQ accepts this replica's publishes: NOT_SERVING while
#: a memory or disk alarm blocks them (Enqueue refuses at once meanwhile) and while connecting.
#: Readiness ("") stays SERVING through an alarm: see docs/pages/reference/errors.md.
PUBLISHING = "publishing"
#: Seconds a starting replica waits for its first read of the quotas before it serves.
QUOTA_LOAD_S = 10.0
#: Seconds a stopping replica gives its leaving the quota members.
LEAVE_S = 2.0


class EnqueueApp(QueueApp[Enqueuer]):
    name = "enqueue"
    #: An EnqueueStream of a large mail from a slow client outlives the default 30 s after its
    #: connection's maximum age (100 MiB at 1 MB/s: 100 s).
    connection_age_grace_s = 300.0

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(enqueue_pb2_grpc.add_EnqueueServiceServicer_to_server, EnqueueServicer(self.service), "mailqueue.v1.EnqueueService")]

    def build(self, b: Backends) -> Enqueuer:
        async def depth(queue: str) -> quotas.Depth:
            c = await b.view.mails.size(queue)
            return quotas.Depth(c.size, c.bytes)

        keeper = QuotaKeeper(b.view.quotas, depth)
        return Enqueuer(b.view, b.broker, b.blobs, self.settings.limits, b.state, b.events, keeper)

    async def connect(self) -> None:
        """Connected once the quotas were read too (a replica that served before would enforce
        none: every mail passes); after QUOTA_LOAD_S it serves all the same, the quotas then
        enforced from their first read (logged)."""
        await super().connect()
        assert self._service is not None and self._service.quotas is not None
        if not await self._service.quotas.wait_loaded(QUOTA_LOAD_S):
            log.warning("serving before the quotas were read: none is enforced until they are",
                        extra={"waited_s": QUOTA_LOAD_S})

    def background(self, b: Backends) -> list[Coroutine[Any, Any, None]]:
        enqueuer = self._service  # built just before (service() answers only once connected)
        assert enqueuer is not None
        # The lease its idempotency claims name; the broker's alarms known before a publish waits on one;
        # the quotas and this replica's heartbeat among the enqueue members (services/app/quota_keeper.py).
        assert enqueuer.quotas is not None
        return [enqueuer.claims.keep_lease(), b.broker.watch_alarms(), enqueuer.quotas.run_forever()]

    async def close(self) -> None:
        """A replica that stops leaves the quota members first: the others take its share at once,
        not after its heartbeat expires (a rolling update's replicas refused mail under its rate)."""
        if self._service is not None and self._service.quotas is not None:
            try:
                async with asyncio.timeout(LEAVE_S):
                    await self._service.quotas.leave()
            except (BackendUnavailable, TimeoutError):
                pass  # its heartbeat expires (MEMBER_TTL_S) as a killed replica's does
        await super().close()

    def conditions(self) -> dict[str, str | None]:
        if not self.connected or self._backends is None:
            return {PUBLISHING: "connecting"}
        return {PUBLISHING: self._backends.broker.blocked()}

"""The RabbitMQ topology: what is declared for each mail queue and for all of them, and by whom.

Per mail queue (names from services/domain/names.py): a durable direct exchange, one work queue
per priority (quorum by default, with a delivery limit so a poison message cannot loop forever)
whose dead letters go to a fanout dead-letter exchange and its bounded durable queue.

Shared by every queue: the delay ladder of services/domain/delays.py (wait queues with a
queue-level TTL that dead-letter from level to level and finally to the delivery exchange, which
routes to the work queue by name; quorum wait queues dead-letter at-least-once, RabbitMQ 3.10+, so
a broker restart mid-ladder loses nothing), the queue for delayed mail whose queue is gone, and one
queue (names.dead_letter_marks_queue) fed by every dead-letter exchange that dequeue_svc reads to
mark what the broker dead-lettered.

Contract: ``declare_queue`` returns once the queue's topology exists; declarations are idempotent
and remembered, and ``forget`` makes the next call declare again (the topology was removed). A
user without the configure permission (dequeue_svc's) is refused once; from then on it waits for
the topology that enqueue_svc declares.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.adapters.rabbitmq.connection import NodeConnection
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.domain import delays, model, names
from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)

#: Seconds between checks for a queue that a user who may not declare waits for.
TOPOLOGY_POLL_S = 0.5


class Topology:
    """Declares (or waits for) the exchanges and queues, remembering what it declared."""

    def __init__(self, connection: NodeConnection, settings: RabbitMQSettings, keyspace: str) -> None:
        self._conn = connection
        self._settings = settings
        #: The view this broker's queues belong to (names the dead-letter marks queue).
        self.marks_queue = names.dead_letter_marks_queue(keyspace)
        self._declared: set[str] = set()
        self._ladder_declared = False
        #: False once a declaration was refused (a user without the configure permission).
        self.may_configure = True

    def forget(self, queue: str, ladder: bool = False) -> None:
        """``queue``'s topology (and the ladder's, with ``ladder``) may be gone: declare it again next time."""
        self._declared.discard(queue)
        if ladder:
            self._ladder_declared = False

    # ------------------------------------------------------------------ arguments
    def work_queue_arguments(self, queue: str) -> dict[str, Any]:
        args: dict[str, Any] = {"x-dead-letter-exchange": names.dead_letter_exchange(queue)}
        if self._settings.queue_type == "quorum":
            args["x-queue-type"] = "quorum"
            args["x-delivery-limit"] = self._settings.delivery_limit
        return args

    def _queue_type(self) -> dict[str, Any]:
        return {"x-queue-type": "quorum"} if self._settings.queue_type == "quorum" else {}

    def ladder_queue_arguments(self, level: int) -> dict[str, Any]:
        target = names.delay_exchange(level - 1) if level > 0 else names.delay_delivery_exchange()
        args: dict[str, Any] = {**self._queue_type(), "x-message-ttl": delays.ttl_ms(level), "x-dead-letter-exchange": target}
        if self._settings.queue_type == "quorum":
            # At-least-once dead-lettering (3.10+): a message moves to the next level only once
            # the next level confirmed it, so a broker crash mid-ladder cannot lose it.
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"
        return args

    def dead_letter_queue_arguments(self) -> dict[str, Any]:
        """The per-queue dead-letter queue keeps the broker's copy of each dead letter (the
        repository, dead_letters_v1, is what operators read; an undecodable message has only this
        copy), bounded: the oldest copies go first past ``dead_letter_max`` or ``dead_letter_keep_s``,
        so a queue that dead-letters for weeks cannot fill the broker's disk and block publishers."""
        s = self._settings
        return {**self._queue_type(), "x-max-length": s.dead_letter_max, "x-overflow": "drop-head",
                "x-message-ttl": s.dead_letter_keep_s * 1000}

    # ------------------------------------------------------------------ shared topology
    async def declare_ladder(self) -> None:
        """The delay ladder and the dead-letter marks queue, shared by every queue (idempotent)."""
        if self._ladder_declared:
            return
        await self._declare_unroutable()
        call = self._conn.call
        channel, w = await self._conn.channel()
        try:
            deliver, lost = names.delay_delivery_exchange(), names.delay_unroutable()
            await call(w, channel.exchange_declare, exchange=deliver, exchange_type="topic", durable=True,
                       arguments={"alternate-exchange": lost})
            for level in range(delays.LEVELS):
                x = names.delay_exchange(level)
                await call(w, channel.exchange_declare, exchange=x, exchange_type="topic", durable=True)
                await call(w, channel.queue_declare, queue=names.delay_queue(level), durable=True,
                           arguments=self.ladder_queue_arguments(level))
                await call(w, channel.queue_bind, queue=names.delay_queue(level), exchange=x,
                           routing_key=delays.level_binding(level, "1"))
                lower = names.delay_exchange(level - 1) if level > 0 else deliver
                await call(w, channel.exchange_bind, destination=lower, source=x,
                           routing_key=delays.level_binding(level, "0"))
            await call(w, channel.queue_declare, queue=self.marks_queue, durable=True,
                       arguments=self._queue_type())
        finally:
            if channel.is_open:
                channel.close()
        self._ladder_declared = True

    async def _declare_unroutable(self) -> None:
        """Where the ladder puts a delayed mail whose queue is gone. Replicated like every other
        queue: a classic queue lives on one node, and while that node is down its declaration
        fails (404, home node down), which would stop every publish that re-declares the ladder.
        A classic one left by an older version is kept (and said once in the log)."""
        lost = names.delay_unroutable()
        call = self._conn.call
        channel, w = await self._conn.channel()
        try:
            await call(w, channel.exchange_declare, exchange=lost, exchange_type="fanout", durable=True)
            await call(w, channel.queue_declare, queue=lost, durable=True, arguments={
                **self._queue_type(), "x-message-ttl": 7 * 24 * 3600 * 1000, "x-max-length": 100_000, "x-overflow": "drop-head"})
            await call(w, channel.queue_bind, queue=lost, exchange=lost, routing_key="")
        except BackendUnavailable as e:
            if "PRECONDITION_FAILED" not in str(e):
                raise
            log.warning("queue %s exists with other arguments (an older, unreplicated version): kept; delete it "
                        "(rabbitmqctl delete_queue %s) to have it declared replicated", lost, lost)
        finally:
            if channel.is_open:
                channel.close()

    async def ensure_marks_queue(self) -> None:
        """The dead-letter marks queue exists: declared with the ladder, or (a user who may not
        declare) waited for."""
        if self.may_configure:
            try:
                await self.declare_ladder()
            except BackendUnavailable as e:
                if not self._refused(e):
                    raise
        if not self.may_configure:
            await self._await_declared([self.marks_queue])

    # ------------------------------------------------------------------ one mail queue
    async def _declare_dead_letter_queue(self, queue: str, dlx: str) -> None:
        """The queue's dead-letter exchange and its bounded queue. One left by an older version
        (unbounded, or with other bounds) is kept, and the log says how to bound it."""
        dlq = names.dead_letter_queue(queue)
        call = self._conn.call
        channel, w = await self._conn.channel()
        try:
            await call(w, channel.exchange_declare, exchange=dlx, exchange_type="fanout", durable=True)
            await call(w, channel.queue_declare, queue=dlq, durable=True, arguments=self.dead_letter_queue_arguments())
        except BackendUnavailable as e:
            if "PRECONDITION_FAILED" not in str(e):
                raise
            s = self._settings
            log.warning("dead-letter queue %s exists with other arguments (an older version: unbounded): kept; bound it "
                        "with a policy: rabbitmqctl set_policy --apply-to queues mailqueue-dead-letters "
                        "'^mailqueue\\..*\\.dead-letter$' '{\"max-length\":%d,\"overflow\":\"drop-head\",\"message-ttl\":%d}'",
                        dlq, s.dead_letter_max, s.dead_letter_keep_s * 1000, extra={"queue": queue})
        finally:
            if channel.is_open:
                channel.close()
        channel, w = await self._conn.channel()
        try:
            await call(w, channel.queue_bind, queue=dlq, exchange=dlx, routing_key="")
        finally:
            if channel.is_open:
                channel.close()

    async def declare_queue(self, queue: str) -> None:
        if queue in self._declared:
            return
        if not self.may_configure:
            await self._await_declared([names.work_queue(queue, p) for p in model.PRIORITIES])
            self._declared.add(queue)
            return
        try:
            await self._declare_queue(queue)
        except BackendUnavailable as e:
            if not self._refused(e):
                raise
            await self.declare_queue(queue)

    def _refused(self, e: BackendUnavailable) -> bool:
        """A declaration refused for want of the configure permission (dequeue_svc's user has none:
        it may not declare, so it may not delete either). From then on this broker only waits for
        the topology that enqueue_svc declares."""
        if "ACCESS_REFUSED" not in str(e):
            return False
        if self.may_configure:
            self.may_configure = False
            log.info("this RabbitMQ user may not declare (no configure permission): using the topology enqueue_svc declares")
        return True

    async def _await_declared(self, rabbit_queues: list[str]) -> None:
        """Wait until each queue exists (a passive declare needs no permission): a consumer that
        subscribes before the first mail of its queue waits for enqueue_svc to declare it."""
        for rabbit_queue in rabbit_queues:
            while not await self._exists(rabbit_queue):
                await asyncio.sleep(TOPOLOGY_POLL_S)

    async def _exists(self, rabbit_queue: str) -> bool:
        return await self._passive(rabbit_queue) is not None

    async def _passive(self, rabbit_queue: str) -> Any:
        """A passive declare (no permission needed): the broker's answer, None when the queue does not exist."""
        channel, w = await self._conn.channel()
        try:
            return await self._conn.call(w, channel.queue_declare, queue=rabbit_queue, passive=True)
        except BackendUnavailable as e:
            if "NOT_FOUND" in str(e):
                return None
            raise
        finally:
            if channel.is_open:
                channel.close()

    async def _declare_queue(self, queue: str) -> None:
        await self.declare_ladder()
        dlx = names.dead_letter_exchange(queue)
        await self._declare_dead_letter_queue(queue, dlx)
        call = self._conn.call
        channel, w = await self._conn.channel()
        try:
            await call(w, channel.queue_bind, queue=self.marks_queue, exchange=dlx, routing_key="")
            await call(w, channel.exchange_declare, exchange=names.exchange(queue), exchange_type="direct", durable=True)
            for priority in model.PRIORITIES:  # one work queue per delivery class
                work = names.work_queue(queue, priority)
                await call(w, channel.queue_declare, queue=work, durable=True, arguments=self.work_queue_arguments(queue))
                await call(w, channel.queue_bind, queue=work, exchange=names.exchange(queue),
                           routing_key=names.priority_key(priority))
                await call(w, channel.queue_bind, queue=work, exchange=names.delay_delivery_exchange(),
                           routing_key=delays.delivery_binding(queue, priority))
        finally:
            if channel.is_open:
                channel.close()
        self._declared.add(queue)

    async def delete_queue(self, queue: str) -> None:
        self._declared.discard(queue)
        call = self._conn.call
        channel, w = await self._conn.channel()
        try:
            for priority in model.PRIORITIES:
                await call(w, channel.queue_delete, queue=names.work_queue(queue, priority))
            await call(w, channel.queue_delete, queue=names.dead_letter_queue(queue))
            await call(w, channel.exchange_delete, exchange=names.exchange(queue))
            await call(w, channel.exchange_delete, exchange=names.dead_letter_exchange(queue))
        finally:
            if channel.is_open:
                channel.close()
        self._declared.discard(queue)

    async def message_count(self, rabbit_queue: str) -> int:
        """Ready messages of one RabbitMQ queue; 0 when it does not exist."""
        frame = await self._passive(rabbit_queue)
        return int(frame.method.message_count) if frame is not None else 0

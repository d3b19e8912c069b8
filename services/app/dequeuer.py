"""The dequeue side of one process (DESIGN §4): subscriptions (services/app/subscription.py), the
mails in flight here, the operator rules as this process sees them, and mark-deleted with its
1/pace browse-start die.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from services.app import browse_start
from services.app.claims import Claims
from services.app.queue_state import QueueState
from services.app.rule_book import RuleBook
from services.app.shaper import Shaper
from services.app.subscription import DEFAULT_PREFETCH, Subscription
from services.domain import dead_letters, model, validation
from services.domain.errors import BackendUnavailable, InvalidArgument
from services.domain.settings import LimitSettings
from services.ports.blobstore import BlobStore
from services.ports.broker import Broker
from services.ports.events import EventLog, Unrecorded
from services.ports.view import View

log = logging.getLogger(__name__)


class Dequeuer:
    def __init__(
        self, view: View, broker: Broker, blobs: BlobStore, limits: LimitSettings, state: QueueState,
        events: EventLog | None = None, handout_event_delay_s: float = 1.0,
    ) -> None:
        self.view = view
        #: Where the hand-outs, answers and rule actions are recorded (services/domain/events.py builds the events).
        self.events: EventLog = events if events is not None else Unrecorded()
        #: A hand-out event is written with its answer's, or on its own after this (services/app/handouts.py).
        self.handout_event_delay_s = handout_event_delay_s
        self.broker = broker
        self.blobs = blobs
        self.limits = limits
        self.state = state
        self._background: set[asyncio.Task[None]] = set()
        #: Subscriptions not closed yet (``drain`` waits for them at shutdown).
        self._open: set[Subscription] = set()
        self._all_closed = asyncio.Event()
        #: The server is stopping (``finish``): no new subscription.
        self._finishing = False
        self._updating: set[str] = set()  # queues whose browse start update is running here
        #: One claim per mail being prepared or handed out by this process.
        self.claims = Claims()
        self.rules = RuleBook(view.rules)
        #: Traffic shaping per destination, shared with the other consuming replicas.
        self.shaper = Shaper(view.shaping)

    async def subscribe(self, queue: str, prefetch: int, max_batch: int = 1) -> Subscription:
        """A subscription to ``queue``: ``prefetch`` unanswered deliveries at most (0: the default),
        handed out up to ``max_batch`` at a time (0 or 1: one by one)."""
        validation.queue_name(queue)
        if prefetch > self.limits.max_prefetch:
            raise InvalidArgument(f"prefetch {prefetch} is over the maximum of {self.limits.max_prefetch}")
        if max_batch > self.limits.max_prefetch:
            raise InvalidArgument(f"max_batch {max_batch} is over the maximum of {self.limits.max_prefetch}")
        await self.state.require_queue(queue)
        if self._finishing:
            raise BackendUnavailable("dequeue", "dequeue_svc is stopping (a rolling update or a scale-in): subscribe again")
        prefetch = prefetch or min(DEFAULT_PREFETCH, self.limits.max_prefetch)  # the default within the server's maximum
        consumer = await self.broker.consume(queue, prefetch)
        self.shaper.consuming(+1)
        # A batch is at most the credit: more could never be handed out at once.
        sub = Subscription(self, queue, consumer, prefetch, min(max(max_batch, 1), prefetch))
        self._open.add(sub)
        if self._finishing:  # finish() ran while the consumer was being made: this one finishes too
            sub.finish()
        return sub

    async def finish(self, timeout_s: float) -> int:
        """The server is stopping: no new subscription, and each open stream hands out nothing
        more and ends once its client answered what it holds (Subscription.finish). Waits up to
        ``timeout_s`` for them; returns how many are still open."""
        self._finishing = True
        for sub in list(self._open):
            sub.finish()
        return await self.drain(timeout_s)

    def closed(self, sub: Subscription) -> None:
        """A subscription ended (its close ran to its end)."""
        self._open.discard(sub)
        self._all_closed.set()

    async def drain(self, timeout_s: float) -> int:
        """Wait, up to ``timeout_s``, for the subscriptions still open to close (the server
        stopped: their streams are cancelled, and each gives back what it holds and writes its
        held hand-out events) before the backends close under them. Returns how many did not."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._open:
            self._all_closed.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._all_closed.wait()
        return len(self._open)

    def carry(self, mail: model.QueuedMail, content: bytes | None) -> bytes | None:
        """The content to carry in a message published again: small mail's only."""
        return self.limits.carried(content, mail.size)

    async def mark_deleted(self, mail: model.QueuedMail, reason: str) -> None:
        await self.view.mails.mark_gone(mail, reason)
        await self._marked(mail)

    async def mark_dead(self, mail: model.QueuedMail, reason: str) -> bool:
        earlier = await self.view.mails.mark_gone_if_live(mail, reason)
        if earlier is not None:
            # Marked as a dead letter already (an answer retried after its nack was lost): the
            # nack goes on; marked otherwise (deleted by an operator, delivered): only acked.
            return dead_letters.kind_of(earlier) is not None
        await self._marked(mail)
        return True

    async def _marked(self, mail: model.QueuedMail) -> None:
        """After a mark: now and then, browse start moved on in the background. Best effort: the
        mark is written, so a configuration read that fails (Cassandra answering the mark, then
        not) skips this once instead of failing the answer (its stream would end, and every
        delivery the client holds would come back)."""
        try:
            config = await self.state.config()
        except BackendUnavailable as e:
            log.debug("browse start update skipped: %s", e, extra={"queue": mail.queue})
            return
        if mail.queue not in self._updating and browse_start.should_update(config.update_browse_start_pace):
            self._updating.add(mail.queue)
            task = asyncio.create_task(self._update_browse_start(mail.queue))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _update_browse_start(self, queue: str) -> None:
        try:
            await browse_start.update(self.view, queue)
        except BackendUnavailable as e:
            log.warning("browse start update skipped: %s", e, extra={"queue": queue})
        finally:
            self._updating.discard(queue)

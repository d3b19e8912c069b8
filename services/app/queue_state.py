"""Per-process caches of what rarely changes: queue existence, view configuration, browse start.

A cached fact found stale is read once, however many callers ask for it meanwhile (a stream's
first deliveries are prepared at once: each read it before); a queue's existence is read by each
caller. Only positive facts are cached (a queue created a moment ago is found at once), for
``config_ttl_s``: a deleted queue stops accepting mail on every replica within it (DeleteQueue
waits that long before it removes the queue's RabbitMQ topology). Browse start is cached for at
most ``browse_start_ttl_s``: it never moves past ``now - slice_window``, so a short staleness
cannot make a node write behind it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable

from services.app.shared_reads import SharedReads
from services.domain import model
from services.domain.errors import NotFound
from services.ports.view import View


class QueueState:
    def __init__(self, view: View, config_ttl_s: float = 10.0, browse_start_ttl_s: float = 1.0) -> None:
        self._view = view
        self._config_ttl = config_ttl_s
        self._browse_ttl = browse_start_ttl_s
        self._known: dict[str, float] = {}
        self._config: tuple[float, model.ViewConfig] | None = None
        self._browse: dict[str, tuple[float, dt.datetime | None]] = {}
        self._content: dict[str, tuple[float, dt.datetime | None]] = {}
        self._policies: dict[str, tuple[float, model.RetryPolicy]] = {}
        #: Reads under way, by what they read: a caller that finds the same fact stale waits for it.
        self._reads = SharedReads()

    @property
    def ttl_s(self) -> float:
        """How long a replica may still act on a cached fact (a queue's existence, its policy)."""
        return self._config_ttl

    async def require_queue(self, queue: str) -> None:
        now = time.monotonic()
        if now - self._known.get(queue, -1e18) <= self._config_ttl:
            return
        # Its own read, never one already under way: one begun before the queue was created would
        # answer NOT_FOUND to a caller that came after (a created queue is found at once).
        if not await self._view.queues.exists(queue):
            self._known.pop(queue, None)
            raise NotFound(f"queue {queue!r} does not exist: create it with AdminService.CreateQueue (mailq create {queue})")  # queue is validated: short
        self._known[queue] = now

    def forget_queue(self, queue: str) -> None:
        self._known.pop(queue, None)
        self._policies.pop(queue, None)
        self._reads.forget(("policy", queue))  # a read under way may predate the change

    async def config(self) -> model.ViewConfig:
        now = time.monotonic()
        if self._config is None or now - self._config[0] > self._config_ttl:
            self._config = (now, await self._reads.get("config", self._view.config.current))
        return self._config[1]

    def forget_config(self) -> None:
        self._config = None
        self._reads.forget("config")  # a read under way may predate the change

    async def retry_policy(self, queue: str) -> model.RetryPolicy:
        """Cached like the configuration: a change reaches every replica within ``config_ttl_s``."""
        now = time.monotonic()
        cached = self._policies.get(queue)
        if cached is None or now - cached[0] > self._config_ttl:
            cached = (now, await self._reads.get(("policy", queue), lambda: self._view.retry_policies.get(queue)))
            self._policies[queue] = cached
        return cached[1]

    def forget_retry_policy(self, queue: str) -> None:
        self._policies.pop(queue, None)
        self._reads.forget(("policy", queue))

    async def browse_start(self, queue: str) -> dt.datetime | None:
        return await self._cached(self._browse, queue, self._browse_ttl, self._view.starts.browse_start)

    async def content_start(self, queue: str) -> dt.datetime | None:
        """Cached like the configuration: content start moves only when the sweep runs."""
        return await self._cached(self._content, queue, self._config_ttl, self._view.starts.content_start)

    async def is_swept(self, queue: str, slice_start: dt.datetime) -> bool:
        """True when the retention sweep has dropped (or is dropping) this slice.

        The cached content start may lag the sweep by ``config_ttl_s``. A mail without a deleted
        mark in a slice before browse start can only be one whose mark the sweep just deleted,
        so for those content start is read afresh: a swept mail is never delivered as a ghost.
        """
        content_start = await self.content_start(queue)
        if content_start is not None and slice_start < content_start:
            return True
        browse_start = await self.browse_start(queue)
        if browse_start is None or slice_start >= browse_start:
            return False
        # Its own read, not one already under way (which may have begun before the mark was read).
        fresh = await self._view.starts.content_start(queue)
        self._content[queue] = (time.monotonic(), fresh)
        return fresh is not None and slice_start < fresh

    async def _cached(
        self, cache: dict[str, tuple[float, dt.datetime | None]], queue: str, ttl: float,
        load: Callable[[str], Awaitable[dt.datetime | None]],
    ) -> dt.datetime | None:
        now = time.monotonic()
        cached = cache.get(queue)
        if cached is None or now - cached[0] > ttl:
            cached = (now, await self._reads.get((id(cache), queue), lambda: load(queue)))
            cache[queue] = cached
        return cached[1]

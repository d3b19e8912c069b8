"""Per-process caches of what rarely changes: queue existence, view configuration, browse start.

Only positive facts are cached (a queue created a moment ago is found at once). Browse start is
cached for at most ``browse_start_ttl_s``: it never moves past ``now - slice_window``, so a short
staleness cannot make a node write behind it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable

from services import model
from services.errors import NotFound
from services.view.view import View


class QueueState:
    def __init__(self, view: View, config_ttl_s: float = 10.0, browse_start_ttl_s: float = 1.0) -> None:
        self._view = view
        self._config_ttl = config_ttl_s
        self._browse_ttl = browse_start_ttl_s
        self._known: set[str] = set()
        self._config: tuple[float, model.ViewConfig] | None = None
        self._browse: dict[str, tuple[float, dt.datetime | None]] = {}
        self._content: dict[str, tuple[float, dt.datetime | None]] = {}

    async def require_queue(self, queue: str) -> None:
        if queue in self._known:
            return
        if not await self._view.queues.exists(queue):
            raise NotFound(f"queue {queue!r} does not exist: create it with AdminService.CreateQueue (mailq create {queue})")
        self._known.add(queue)

    async def config(self) -> model.ViewConfig:
        now = time.monotonic()
        if self._config is None or now - self._config[0] > self._config_ttl:
            self._config = (now, await self._view.config.current())
        return self._config[1]

    def forget_config(self) -> None:
        self._config = None

    async def browse_start(self, queue: str) -> dt.datetime | None:
        return await self._cached(self._browse, queue, self._browse_ttl, self._view.starts.browse_start)

    async def content_start(self, queue: str) -> dt.datetime | None:
        """Cached like the configuration: content start moves only when the sweep runs."""
        return await self._cached(self._content, queue, self._config_ttl, self._view.starts.content_start)

    @staticmethod
    async def _cached(
        cache: dict[str, tuple[float, dt.datetime | None]], queue: str, ttl: float,
        load: Callable[[str], Awaitable[dt.datetime | None]],
    ) -> dt.datetime | None:
        now = time.monotonic()
        cached = cache.get(queue)
        if cached is None or now - cached[0] > ttl:
            cached = (now, await load(queue))
            cache[queue] = cached
        return cached[1]

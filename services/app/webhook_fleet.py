"""The endpoints webhook_svc delivers to, kept in line with their registrations: every reload,
a task per endpoint is started for an endpoint added, stopped for one removed, and restarted for
one whose settings (or secret) changed. A stopped endpoint's checkpoint is left as it is, so
an endpoint added again (same name) resumes after it.

- ``load`` returns the wanted endpoints by name, each with its ``from_oldest``; it raises
  (BackendUnavailable, ConfigurationError) when the registrations cannot be read, and the running
  endpoints are then left as they are.
- ``run`` is what a task does for one endpoint (until cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from prometheus_client import Gauge

from services.domain.webhook_registry import shown_url
from services.domain.webhooks import Endpoint

log = logging.getLogger(__name__)

ENDPOINTS = Gauge("mailqueue_webhook_endpoints", "Webhook endpoints webhook_svc delivers to now (registered with mailq webhook add, "
                  "plus MAILQUEUE_WEBHOOKS_FILE's)")
RELOAD_FAILURES = Gauge("mailqueue_webhook_reload_failing", "1 while the last reading of the webhook registrations failed "
                        "(the endpoints already running go on)")

Wanted = Mapping[str, tuple[Endpoint, bool]]


class EndpointFleet:
    def __init__(self, load: Callable[[], Awaitable[Wanted]], run: Callable[[Endpoint, bool], Coroutine[Any, Any, None]]) -> None:
        self._load, self._run = load, run
        self._tasks: dict[str, tuple[tuple[Endpoint, bool], asyncio.Task[None]]] = {}
        #: Tasks cancelled and not ended yet.
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks)

    async def reload(self) -> None:
        """Read the registrations and start, stop or restart endpoint tasks to match; raises what ``load`` raises."""
        wanted = await self._load()
        for name in [n for n in self._tasks if n not in wanted or self._tasks[n][0] != wanted[n]]:
            await self._stop(name, "removed" if name not in wanted else "changed")
        for name, spec in wanted.items():
            if name not in self._tasks:
                self._tasks[name] = (spec, asyncio.create_task(self._run(*spec), name=f"webhook:{name}"))
                log.info("webhook endpoint started", extra={"endpoint": name, "url": shown_url(spec[0].url)})
        ENDPOINTS.set(len(self._tasks))

    async def reload_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reload()
                RELOAD_FAILURES.set(0)
            except Exception as e:  # noqa: BLE001 - the endpoints running go on; the next round tries again
                RELOAD_FAILURES.set(1)
                log.warning("webhook registrations not read; the endpoints running go on", extra={"error": str(e)[:300]})

    async def close(self) -> None:
        for name in list(self._tasks):
            await self._stop(name, "shutting down")
        if self._ending:  # stopped by a reload that was cancelled before their end
            await asyncio.wait(list(self._ending))

    async def _stop(self, name: str, why: str) -> None:
        """Cancel the endpoint's task and wait for its end; a caller cancelled meanwhile (the
        reloader, when the service stops) is cancelled, not swallowed, so it starts nothing after,
        and ``close`` waits for the task instead."""
        _, task = self._tasks.pop(name)
        task.cancel()
        self._ending.add(task)
        task.add_done_callback(self._ended)
        await asyncio.wait([task])
        log.info("webhook endpoint stopped (its checkpoint is kept)", extra={"endpoint": name, "why": why})

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._ending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("webhook endpoint ended with an error", extra={"endpoint": task.get_name(), "error": str(task.exception())[:300]})

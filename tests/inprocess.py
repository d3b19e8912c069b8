"""The services served inside the test process: an app connected to the real backends and served
on a free loopback port (``RunningApp``), on an asyncio loop in a background thread (``LoopThread``).

What runs them as processes, their environment (``service_env``), polling (``wait_until``) and the
cleanup of the backends is the one harness, stack/harness.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from services.runtime.server import SERVING, App, Served, create_server
from services.runtime.settings import Settings
from stack.harness import as_service

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; ``run`` executes a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class RunningApp:
    """An app connected to the real backends and served on a free loopback port."""

    def __init__(self, loop: LoopThread, app_cls: type[App], name: str, env: dict[str, str]) -> None:
        self.loop = loop
        self.app = app_cls(Settings.from_env(name, as_service(name, env)))

        async def start() -> Served:
            await self.app.connect()
            self.app.connected = True
            served = create_server(self.app, host="127.0.0.1", port=0)
            await served.server.start()
            await served.set_health(SERVING)
            return served

        self.served = loop.run(start())
        self.server, self.port = self.served.server, self.served.port
        self.target = f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.target)

    def stop(self) -> None:
        async def stop() -> None:
            await self.server.stop(None)
            await self.app.close()

        self.loop.run(stop())

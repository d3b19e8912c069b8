"""Test harness: services run in-process on a background event loop, on free ports.

Real backends only: the apps connect to the Cassandra, RabbitMQ and MinIO that
stack/stack.sh started. Each test session gets its own keyspace.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc

from services.runtime.server import SERVING, App, Served, create_server
from services.runtime.settings import Settings
from stack.harness import (  # noqa: F401 - the tests' names for the shared harness (stack/harness.py)
    ROOT,
    NotServing,
    Service,
    ServiceProcess,
    as_service,
    broker_parameters,
    credentials_dir,
    free_port,
    health,
    is_serving,
    prepare,
    scrape,
    stack,
    stack_env,
)

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


def wait_until(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def service_env(keyspace: str, **extra: str) -> dict[str, str]:
    """A service's environment on a keyspace of the test's own: the operator's variables (the
    backends over TLS), gRPC in the clear on loopback (explicitly: MAILQUEUE_PLAINTEXT; the TLS
    tests serve TLS), and the keyspace prepared as the operator would (``prepare``)."""
    env = dict(os.environ)
    env["MAILQUEUE_PLAINTEXT"] = "true"
    # Gauges and the healer off: a test keyspace holds hundreds of queues (tests that need them turn them on).
    # Counter updates written at once: tests compare counters with exact counts right away (the
    # gathering has a test of its own).
    env.update({"MAILQUEUE_CASSANDRA_KEYSPACE": keyspace, "MAILQUEUE_PORT": "0", "MAILQUEUE_METRICS_PORT": "0",
                "MAILQUEUE_GAUGE_INTERVAL_S": "0", "MAILQUEUE_COUNTER_FLUSH_S": "0", "MAILQUEUE_HEAL_INTERVAL_S": "0"})
    env.update(extra)
    if env.get("MAILQUEUE_TLS_CERT_FILE"):
        env.pop("MAILQUEUE_PLAINTEXT")
    elif "MAILQUEUE_TLS_CA_FILE" not in extra:
        env.pop("MAILQUEUE_TLS_CA_FILE", None)  # calls to a plaintext blob_svc: in the clear too
    prepare(env)
    return env


def new_keyspace() -> str:
    return f"mq_test_{uuid.uuid4().hex[:12]}"


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


def listed_services(target: str) -> set[str]:
    """The services the server's reflection lists."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        return {s.name for r in responses for s in r.list_services_response.service}

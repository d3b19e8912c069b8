"""Test harness: services run in-process on a background event loop, on free ports.

Real backends only: the apps connect to the Cassandra, RabbitMQ and MinIO that
stack/stack.sh started. Each test session gets its own keyspace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc

from services.runtime.server import SERVING, App, Served, create_server
from services.runtime.settings import Settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def stack(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), *args], capture_output=True, text=True, check=check)


def stack_env(role: str = "operator") -> dict[str, str]:
    """The MAILQUEUE_* variables of ``role`` on the single-node stack (stack/stack.sh env ROLE):
    backends over TLS with that role's own credential."""
    out = {}
    for line in stack("env", role).stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def credentials_dir(role: str) -> str:
    return os.path.join(os.environ.get("MAILQUEUE_STACK_DIR", os.path.join(ROOT, ".stack")), "credentials", role)


def as_service(name: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the backend credential of service ``name`` (its own Cassandra role, RabbitMQ
    user and S3 user) in place of the operator's, when the stack made one: services under test
    run with exactly the rights they have in production."""
    own = credentials_dir(name)
    if env.get("MAILQUEUE_CREDENTIALS_DIR") == credentials_dir("operator") and os.path.isdir(own):
        return {**env, "MAILQUEUE_CREDENTIALS_DIR": own}
    return env


_PREPARED: set[tuple[str, ...]] = set()


def prepare(env: dict[str, str]) -> None:
    """What the operator does before services use a keyspace and a bucket: the schema step with
    the schema role (services may not create tables), and the bucket with the operator's
    credential (services may not create buckets). Once per keyspace and bucket per process."""
    from services.runtime.settings import cassandra_from_env, s3_from_env

    if "MAILQUEUE_CREDENTIALS_DIR" not in env:
        return  # a stack without credentials: the services create what they need
    c = cassandra_from_env(env)
    key = ("cassandra", ",".join(c.hosts), str(c.port), c.keyspace)
    if key not in _PREPARED:
        from services.domain.errors import BackendUnavailable
        from services.runtime.migrate import migrate, service_roles

        schema_env = {**env, "MAILQUEUE_CREDENTIALS_DIR": credentials_dir("schema")}
        try:
            migrate(cassandra_from_env(schema_env), service_roles(schema_env))
            _PREPARED.add(key)
        except BackendUnavailable:
            pass  # a test of a Cassandra that does not answer: the service says so itself
    s3 = s3_from_env({**env, "MAILQUEUE_CREDENTIALS_DIR": credentials_dir("operator")})
    key = ("s3", s3.endpoint, s3.bucket)
    if key not in _PREPARED:
        from services.adapters.s3 import errors as s3errors
        from services.adapters.s3.client import Bucket

        bucket = Bucket(s3)
        try:
            if not bucket.exists():
                bucket.create()
            _PREPARED.add(key)
        except s3errors.ERRORS:
            pass  # a test of an S3 that does not answer


def broker_parameters(env: dict[str, str] | None = None):  # noqa: ANN201
    """pika's parameters for the broker ``env`` names (default: this process's), over TLS."""
    from services.adapters.rabbitmq.broker import connection_parameters
    from services.runtime.settings import rabbitmq_from_env

    settings = rabbitmq_from_env(os.environ if env is None else env)
    return connection_parameters(settings.url, settings)


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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(target: str, service: str = "", credentials: grpc.ChannelCredentials | None = None) -> int:
    """The gRPC health status of ``service`` ("": the server's overall one, readiness; "liveness"),
    -1 when the server does not answer. ``credentials``: over TLS."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with (grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)) as ch:
        try:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
        except grpc.RpcError:
            return -1


def is_serving(target: str, credentials: grpc.ChannelCredentials | None = None) -> bool:
    from grpc_health.v1 import health_pb2

    return health(target, credentials=credentials) == health_pb2.HealthCheckResponse.SERVING


def listed_services(target: str) -> set[str]:
    """The services the server's reflection lists."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        return {s.name for r in responses for s in r.list_services_response.service}


class ServiceProcess:
    """A real service process (``python -m <name>_svc``) on a free loopback port."""

    def __init__(self, name: str, env: dict[str, str], metrics: bool = False,
                 credentials: grpc.ChannelCredentials | None = None, wait: bool = True) -> None:
        self.name = name
        self.credentials = credentials  # TLS (the process serves it: MAILQUEUE_TLS_* in env)
        self.port = free_port()
        self.metrics_port = free_port() if metrics else 0
        self.env = {**as_service(name, env), "MAILQUEUE_PORT": str(self.port), "MAILQUEUE_METRICS_PORT": str(self.metrics_port),
                    "MAILQUEUE_LOG_LEVEL": "WARNING"}
        self.target = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start(wait)

    def start(self, wait: bool = True) -> None:
        """Start the process and (``wait``) poll until its health says SERVING."""
        import sys

        # Its log (WARNING and above) goes to a file, for the failure that needs it.
        self.log = os.path.join(tempfile.gettempdir(), f"mailqueue-test-{self.name}-{self.port}.log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", f"{self.name}_svc"], cwd=ROOT, env=self.env,
                                         stdout=subprocess.DEVNULL, stderr=log)
        if wait:
            wait_until(lambda: is_serving(self.target, self.credentials), 60, interval=0.1, what=f"{self.name}_svc SERVING")

    def channel(self) -> grpc.Channel:
        if self.credentials is not None:
            return grpc.secure_channel(self.target, self.credentials)
        return grpc.insecure_channel(self.target)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no shutdown code runs
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus sample's values, over the samples whose labels include ``labels``."""
        return scrape(self.metrics_port, name, **labels)


def scrape(port: int, name: str, host: str = "127.0.0.1", **labels: str) -> float:
    """Sum of a Prometheus sample's values served on ``host:port``, over the samples whose labels include ``labels``."""
    import re
    import urllib.request

    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for sample_labels, value in re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", body, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', sample_labels))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total

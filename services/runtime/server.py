"""The server runtime: ``create_server()`` builds, ``serve()`` runs until SIGTERM/SIGINT.

Every service is an :class:`App`: it lists its servicers, connects its backends and checks them.
The runtime serves health and reflection, exposes Prometheus metrics, and keeps the health
status honest: NOT_SERVING until the backends answer (the process does not crash while they are
down), SERVING once they do, NOT_SERVING again when a check fails and first thing on shutdown.
That is readiness (the overall "" service and each service name). Liveness is its own name,
``liveness``: SERVING while the process answers at all, whatever its backends do, so that a
backend outage takes pods out of load balancing without restarting them. An app may report
conditions of its own under further names (``App.conditions``: enqueue's ``publishing``), which
leave readiness alone.

Crash-only: nothing here is needed for correctness. SIGTERM drains for nicer rolling updates;
SIGKILL at any instant loses nothing, and start-up is recovery.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge, start_http_server

from services.adapters.grpc_channels import MAX_MESSAGE
from services.domain.errors import BackendUnavailable, ConfigurationError
from services.runtime import heap, logs, workers
from services.runtime.auth import TokenAuth, check_exposure, check_transport
from services.runtime.interceptors import ErrorsAndMetrics
from services.runtime.settings import Settings, backends_in_the_clear
from services.runtime.tls import server_credentials
from services.runtime.watchdog import LoopWatchdog

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: The health service name of the liveness probe (Kubernetes: ``grpc: {port, service: liveness}``).
LIVENESS = "liveness"
#: Seconds between backend checks once serving, and between connection attempts before.
CHECK_INTERVAL_S = 5.0
RETRY_INTERVAL_S = 2.0
#: Seconds between two readings of an app's conditions (App.conditions).
CONDITIONS_INTERVAL_S = 0.5
#: Seconds a backend check may take: one that has not answered by then fails (NOT_SERVING, with
#: the reason in the log) rather than leaving the last status standing while calls wait.
CHECK_TIMEOUT_S = 10.0

UP = Gauge("mailqueue_serving", "1 while the service reports SERVING")


class App(abc.ABC):
    """A service: its servicers and its backends."""

    #: Short name ("enqueue", ...): default port, log field.
    name: str

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connected = False

    @abc.abstractmethod
    def servicers(self) -> list[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]]:
        """``(add_XServicer_to_server, servicer, "mailqueue.v1.XService")`` for each service."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Connect every backend; raise BackendUnavailable to be retried, ConfigurationError to stop."""

    @abc.abstractmethod
    async def check(self) -> None:
        """Raise BackendUnavailable when a backend does not answer."""

    async def close(self) -> None:
        return None

    async def finish(self, grace_s: float) -> None:
        """The server is stopping and gives in-flight calls ``grace_s``: long streams end cleanly
        within it (run beside the gRPC server's own stop)."""
        return None

    #: The grace after a connection's maximum age during which its calls may go on (None: for as
    #: long as they last; a consumer's stream cut there would give back every delivery it holds).
    connection_age_grace_s: float | None = 30.0

    def conditions(self) -> dict[str, str | None]:
        """Health names beyond readiness, each SERVING while its condition holds: name -> why it
        does not hold now (None: it holds). Read often: no I/O."""
        return {}

    def require_connected(self) -> None:
        if not self.connected:
            raise BackendUnavailable(self.name, "the service is still connecting to its backends")


@dataclasses.dataclass
class Served:
    """A built server: the gRPC server, its health servicer, the bound port, the services served."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    service_names: list[str]

    async def set_health(self, status: int, names: list[str] | None = None) -> None:
        """``status`` for the overall health ("") and every API's name (``names``: only those)."""
        for name in ["", *self.service_names] if names is None else names:
            await self.health.set(name, status)
        UP.set(1 if status == SERVING else 0)


#: gRPC's "no limit" for a duration in milliseconds (INT_MAX).
INFINITE_MS = 2**31 - 1

#: After a lameduck, how long the APIs answer NOT_SERVING before the connections close.
HEALTH_NOTICE_S = 1.0


def create_server(app: App, host: str | None = None, port: int | None = None) -> Served:
    """Build the server (not started). Port 0 binds a free port; the bound port is returned."""
    s = app.settings.server
    server = grpc.aio.server(
        interceptors=[TokenAuth(s.tokens, s.tls.identities), ErrorsAndMetrics()],
        options=[
            ("grpc.max_connection_age_ms", s.max_connection_age_s * 1000),
            ("grpc.max_connection_age_grace_ms",
             INFINITE_MS if app.connection_age_grace_s is None else int(app.connection_age_grace_s * 1000)),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            # Workers share their port (services/runtime/workers.py); a single process holds its
            # own: a second copy started by mistake is refused, not handed half the connections.
            ("grpc.so_reuseport", 1 if s.worker else 0),
        ],
    )
    names = []
    for add, servicer, full_name in app.servicers():
        add(servicer, server)
        names.append(full_name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    address = f"{host or s.host}:{s.port if port is None else port}"
    credentials = server_credentials(s.tls)
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    return Served(server, health_servicer, bound, names)


async def health_only_server(served: Served, host: str, port: int) -> grpc.aio.Server:
    """The plaintext port of the kubelet's gRPC probes, which do not speak TLS: it serves the same
    health statuses and nothing else (no API, no reflection), so the probes stay meaningful while
    the API is served only over TLS."""
    probes = grpc.aio.server(interceptors=[ErrorsAndMetrics()])  # probes are counted like any call
    health_pb2_grpc.add_HealthServicer_to_server(served.health, probes)
    probes.add_insecure_port(f"{host}:{port}")
    await probes.start()
    return probes


async def supervise(app: App, served: Served) -> None:
    """Connect, then keep the health status in line with the backends, forever."""
    await served.health.set(LIVENESS, SERVING)
    await served.set_health(NOT_SERVING)
    serving = False
    attempt = 0
    failures = 0
    while True:
        try:
            if not app.connected:
                attempt += 1
                await app.connect()
                app.connected = True
                log.info("backends connected", extra={"attempts": attempt})
                if app.settings.server.gc_tuned and heap.settle():  # start-up's objects, the driver's schema metadata among them
                    log.debug("start-up heap frozen", extra={"frozen_objects": gc.get_freeze_count()})
            await checked(app)
            failures = 0
            if not serving:
                await served.set_health(SERVING)
                serving = True
                log.info("serving")
        except BackendUnavailable as e:
            failures += 1
            if serving or failures in (1, 2) or failures % 15 == 0:  # say it, then every 30 s
                log.warning("not serving: %s", e, extra={"failures": failures})
            if serving:
                await served.set_health(NOT_SERVING)
                serving = False
        await asyncio.sleep(CHECK_INTERVAL_S if serving else RETRY_INTERVAL_S)


async def report_conditions(app: App, served: Served) -> None:
    """Keep the health name of each of the app's conditions in line with it, forever."""
    shown: dict[str, int] = {}
    while True:
        for name, reason in app.conditions().items():
            status = SERVING if reason is None else NOT_SERVING
            if shown.get(name) != status:
                await served.health.set(name, status)
                shown[name] = status
        await asyncio.sleep(CONDITIONS_INTERVAL_S)


async def checked(app: App) -> None:
    """``app.check()`` within CHECK_TIMEOUT_S; BackendUnavailable when it fails or takes longer."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await app.check()
    except TimeoutError:
        raise BackendUnavailable(app.name, f"the backend check did not answer within {CHECK_TIMEOUT_S:g} s") from None


async def serve(app: App) -> None:
    s = app.settings.server
    logs.configure(app.name, s.log_level, worker=s.worker)
    heap.count_pauses()
    for name, meant in app.settings.misspelled if s.worker <= 1 else ():  # said once for all workers
        log.warning("%s is set but not read: did you mean %s?", name, meant, extra={"variable": name, "meant": meant})
    settings = app.settings
    for clear in backends_in_the_clear(settings.cassandra, settings.rabbitmq, settings.s3) if s.worker <= 1 else ():
        log.warning("reaching %s: mail content and credentials cross the network in the clear", clear, extra={"backend": clear})
    watchdog = LoopWatchdog(asyncio.get_running_loop())
    watchdog.start()
    if s.metrics_port:
        try:
            start_http_server(s.metrics_port, addr=s.host)
        except OSError as e:
            _refuse(f"MAILQUEUE_METRICS_PORT={s.metrics_port}: cannot listen on {s.host}:{s.metrics_port} ({e.strerror}): "
                    "another process has it (a second copy of this service?); stop it or set another port")
    try:
        served = create_server(app)
    except RuntimeError as e:  # grpc's "Failed to bind to address ...", nothing more precise
        _refuse(f"MAILQUEUE_PORT={s.port}: cannot listen on {s.host}:{s.port} ({e}): another process has the port, "
                "or the certificate and key do not load (MAILQUEUE_TLS_CERT_FILE, MAILQUEUE_TLS_KEY_FILE: PEM, one pair)")
    server, port = served.server, served.port
    # grpc's health service starts with "" SERVING: not ready until the backends have answered.
    await served.set_health(NOT_SERVING)
    await server.start()
    probes = await health_only_server(served, s.host, s.health_port) if s.health_port else None
    log.info(
        "listening",
        extra={"address": f"{s.host}:{port}", "metrics": f"http://{s.host}:{s.metrics_port}/metrics" if s.metrics_port else "off",
               "tls": ("mutual" if s.tls.client_ca_file else "on") if s.tls.serving else "off",
               "health_port": s.health_port or "off"},
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    supervisor = asyncio.create_task(supervise(app, served))
    conditions = asyncio.create_task(report_conditions(app, served))
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({supervisor, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if supervisor in done and supervisor.exception() is not None:
        exc = supervisor.exception()
        if isinstance(exc, ConfigurationError):
            log.critical("refusing to start: %s", exc)
            await server.stop(0)
            sys.exit(2)
        raise exc  # type: ignore[misc]
    log.info("draining", extra={"grace_s": s.shutdown_grace_s, "lameduck_s": s.lameduck_s})
    supervisor.cancel()  # it would set SERVING again
    conditions.cancel()
    # Readiness (the overall health) at once: no new traffic from the Service.
    await served.set_health(NOT_SERVING, [""])
    if s.lameduck_s:
        # Still serving while DNS answers naming this pod expire (a second signal cuts it short);
        # each API's own health name stays SERVING meanwhile, so a client that watches it
        # (healthCheckConfig) keeps calling here until it can learn the new pods.
        stop.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(s.lameduck_s):
                await stop.wait()
    await served.set_health(NOT_SERVING)
    if s.lameduck_s:
        # A moment for those clients to leave before the connections close: a call that arrives
        # as the server stops, before a handler takes it, ends CANCELLED (grpc/grpc#41785).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HEALTH_NOTICE_S):
                await stop.wait()
    finishing = asyncio.ensure_future(app.finish(s.shutdown_grace_s))
    await server.stop(s.shutdown_grace_s)
    with contextlib.suppress(Exception):
        await finishing
    if probes is not None:
        await probes.stop(0)
    await app.close()
    watchdog.stop()
    log.info("stopped")


def _refuse(reason: str) -> NoReturn:
    """A start-up the operator must mend (a port taken, files that do not load): one log line
    naming the variable, exit 2, as a configuration refused before the start."""
    log.critical("refusing to start: %s", reason)
    sys.exit(2)


def main(app_factory: Callable[[Settings], App], name: str) -> None:
    worker = os.environ.get(workers.WORKER_VARIABLE, "")
    # JSON from the first line, refusals included (and a worker's refusal with its index)
    logs.configure(name, logs.level_of(os.environ), worker=int(worker) if worker.isdigit() else 0)
    try:
        settings = Settings.from_env(name)
        logs.configure(name, settings.server.log_level, worker=settings.server.worker)
        check_transport(settings.server.host, settings.server.tls.serving, settings.server.plaintext)
        check_exposure(settings.server.host, settings.server.tokens, settings.server.tls.identities)
    except ConfigurationError as e:
        _refuse(str(e))
    if settings.server.workers > 1 and not settings.server.worker:
        # The package run as ``python -m <package>`` (webhook_svc's app lives in services.runtime).
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        package = spec.parent if spec is not None and spec.parent else app_factory.__module__.partition(".")[0]
        sys.exit(workers.Supervisor(package, settings.server).run())
    workers.attach(settings.server)
    try:
        app = app_factory(settings)  # an app may read settings of its own (webhook_svc's)
    except ConfigurationError as e:
        _refuse(str(e))
    asyncio.run(serve(app))

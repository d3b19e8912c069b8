"""webhook_svc: delivers the event stream to the registered HTTP endpoints
(services/app/webhook_delivery.py), each endpoint in a task of its own with a consumer of its own;
checkpoints in Cassandra (``webhook_checkpoints_v1``).

Endpoints come from two places, read again every MAILQUEUE_WEBHOOK_RELOAD_S (default 5 s;
services/app/webhook_fleet.py starts and stops their tasks):

- the registrations stored with ``mailq webhook add`` (WebhookAdminService, ``webhooks_v1``);
- MAILQUEUE_WEBHOOKS_FILE, if set: a JSON array of endpoints (a name also registered: the file's wins)::

    [{"name": "billing", "url": "https://billing.example/hooks", "secret_file": "/secrets/billing",
      "queues": ["outbound"], "types": ["delivered", "rejected"], "max_age_s": 86400, "from_oldest": false}]

``name`` keys the checkpoint (renaming an endpoint starts it over); ``secret_file`` holds the HMAC
secret, read here and nowhere else (a registration keeps the path only; a regular file of at most
64 KiB, and a registration's inside MAILQUEUE_WEBHOOK_SECRETS_DIR when that is set: ``read_secret``); ``queues``/``types``
empty or absent: every one; ``from_oldest``: an endpoint without a checkpoint starts at the
oldest event kept instead of the next one. A registered endpoint whose secret file cannot be
read is skipped (logged) until it can.

It serves gRPC health (SERVING once the stream is declared and the endpoints loaded, NOT_SERVING
while Cassandra or RabbitMQ does not answer), reflection and Prometheus metrics like every
service (services/runtime/server.py): port MAILQUEUE_PORT (default 50055), metrics on +1000.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Mapping
from typing import Any

from services.adapters.cassandra.view import View
from services.adapters.cassandra.webhook_checkpoints import CassandraCheckpoints
from services.adapters.cassandra.webhooks_store import CassandraWebhooks
from services.adapters.http_poster import UrllibPoster
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
from services.app.webhook_admin import WebhookAdmin
from services.app.webhook_delivery import EndpointDelivery
from services.app.webhook_fleet import EndpointFleet
from services.domain import webhook_registry
from services.domain.errors import ConfigurationError, InvalidArgument
from services.domain.event_stream import EventFilter, streamed
from services.domain.events import EventType
from services.domain.validation import queue_name
from services.domain.webhook_registry import DEFAULT_MAX_AGE_S, MIN_MAX_AGE_S, Registration
from services.domain.webhooks import Endpoint
from services.ports.events import EventLog
from services.runtime import logs, server
from services.runtime.settings import Settings, _float, _get

log = logging.getLogger("mailqueue.webhooks")

#: Stream messages each endpoint's consumer may hold unacknowledged (services/adapters/rabbitmq/event_stream.py).
WEBHOOK_PREFETCH = 8

#: Seconds before an endpoint's delivery is started again after its stream or checkpoint failed.
RESTART_S = 2.0


#: The largest secret file read (an HMAC key needs 32 bytes; a larger file is a wrong path).
MAX_SECRET_BYTES = 64 * 1024


def read_secret(path: str, folder: str = "") -> bytes:
    """The HMAC secret in the file at ``path``: a regular file of at most MAX_SECRET_BYTES, inside
    ``folder`` when one is set (MAILQUEUE_WEBHOOK_SECRETS_DIR; the file as opened, after its links:
    Kubernetes' own links inside a mounted Secret pass, a link out of it does not). A registration
    names the path, so without these a device (/dev/zero, read for ever on the event loop) or a
    service's own credential file could be named. ValueError or OSError saying what is wrong."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"the secret file {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if folder:
            opened, inside = _opened(fd, path), os.path.realpath(folder)
            if os.path.commonpath([opened, inside]) != inside:
                raise ValueError(f"the secret file {path} is outside MAILQUEUE_WEBHOOK_SECRETS_DIR={folder}")
        secret = f.read(MAX_SECRET_BYTES + 1)
    if len(secret) > MAX_SECRET_BYTES:
        raise ValueError(f"the secret file {path} is larger than {MAX_SECRET_BYTES} bytes: not a secret")
    secret = secret.strip()
    if not secret:
        raise ValueError(f"the secret file {path} is empty")
    return secret


def _opened(fd: int, path: str) -> str:
    """The real path of the file open as ``fd``: Linux names it in /proc; elsewhere ``path`` with
    its links followed, if that is still the file open (else "/", inside no secrets folder)."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.exists(proc):
        return os.path.realpath(proc)
    real, st = os.path.realpath(path), os.fstat(fd)
    try:
        now = os.stat(real)
    except OSError:
        return "/"
    return real if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) else "/"


def endpoints_from_file(path: str, running: bool = False) -> list[tuple[Endpoint, bool]]:
    """(endpoint, from_oldest) for each entry of the file; ConfigurationError naming what is wrong.
    ``running`` (a reload, not the start): an entry whose secret file cannot be read is skipped and
    logged, as a registration's is, so the other endpoints' changes still take effect."""
    try:
        with open(path) as f:
            entries = json.load(f)
        out, names = [], set()
        for entry in entries:
            try:
                secret = read_secret(entry["secret_file"])
            except (OSError, ValueError) as e:
                if not running:
                    raise
                log.error("webhook endpoint of MAILQUEUE_WEBHOOKS_FILE skipped: its secret file cannot be read (fix it; "
                          "it is tried again at each reload)", extra={"endpoint": entry.get("name"), "error": str(e)})
                continue
            if entry["name"] in names:
                raise ValueError(f"endpoint {entry['name']!r}: a name used twice")
            try:  # what a registration is held to (no user or password in it: it would be logged)
                webhook_registry.name_of(str(entry["name"]))
                webhook_registry.url_of(str(entry["url"]))
                # a history-only type would be waited for forever, a queue no queue can have matches nothing
                wanted = EventFilter.of([queue_name(str(q)) for q in entry.get("queues", ())],
                                        streamed([EventType(t) for t in entry.get("types", ())]))
            except InvalidArgument as e:
                raise ValueError(f"endpoint {str(entry['name'])[:64]!r}: {e}") from None
            names.add(entry["name"])
            max_age = float(entry.get("max_age_s", 0)) or DEFAULT_MAX_AGE_S  # 0: the default, as a registration's
            if max_age < MIN_MAX_AGE_S:
                raise ValueError(f"endpoint {entry['name']!r}: max_age_s {max_age:g} is under {MIN_MAX_AGE_S:g} s: every "
                                 "event would be dropped")
            batch, timeout = int(entry.get("batch_size", 100)), float(entry.get("timeout_s", 10))
            if not 1 <= batch <= 10_000 or not 0 < timeout <= 3600:  # 0 would be an unbounded queue, or no POST ever ending in time
                raise ValueError(f"endpoint {entry['name']!r}: batch_size {batch} (1 to 10000) or timeout_s {timeout:g} "
                                 "(above 0, at most 3600) out of range")
            out.append((Endpoint(entry["name"], entry["url"], secret, wanted, max_age, batch, timeout),
                        bool(entry.get("from_oldest", False))))
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigurationError(f"MAILQUEUE_WEBHOOKS_FILE={path}: {e}") from e


def endpoint_of(r: Registration, secrets_dir: str = "") -> Endpoint | None:
    """A registration as an endpoint, its secret read from its file; None (logged) when that file
    cannot be read, or when its URL is one this version refuses (registered by an older one: a
    link-local address)."""
    try:
        webhook_registry.url_of(r.url)
    except InvalidArgument as e:
        log.error("webhook endpoint skipped: its URL is refused (register it again with another one)",
                  extra={"endpoint": r.name, "error": str(e)})
        return None
    try:
        secret = read_secret(r.secret_file, secrets_dir)
    except (OSError, ValueError) as e:
        log.error("webhook endpoint skipped: its secret file cannot be read (fix the file or the mounted Secret; "
                  "it is tried again at each reload)", extra={"endpoint": r.name, "secret_file": r.secret_file, "error": str(e)})
        return None
    return Endpoint(r.name, r.url, secret, EventFilter.of(r.queues, r.types), r.max_age_s)


def webhook_admin(view: View, keyspace: str, events: EventLog) -> WebhookAdmin:
    """WebhookAdminService's use-case over the registrations of ``keyspace`` (browse_svc serves it)."""
    return WebhookAdmin(CassandraWebhooks(view.session, keyspace), events)


async def supervise(delivery: EndpointDelivery) -> None:
    """Run one endpoint's delivery for ever: after a backend failure, start again from its checkpoint."""
    while True:
        try:
            await delivery.run()
        except Exception as e:  # noqa: BLE001 - BackendUnavailable mostly; each endpoint keeps going on its own
            log.warning("webhook delivery stopped; starting again from its checkpoint",
                        extra={"endpoint": delivery.endpoint.name, "error": str(e)[:300], "in_s": RESTART_S})
            await asyncio.sleep(RESTART_S)


class WebhookApp(server.App):
    name = "webhook"

    def __init__(self, settings: Settings, env: Mapping[str, str] = os.environ) -> None:
        super().__init__(settings)
        self._file = _get(env, "WEBHOOKS_FILE", "")
        #: Where a registration's secret file must be (empty: anywhere webhook_svc may read).
        self._secrets_dir = _get(env, "WEBHOOK_SECRETS_DIR", "")
        if self._secrets_dir and not os.path.isdir(self._secrets_dir):
            raise ConfigurationError(f"MAILQUEUE_WEBHOOK_SECRETS_DIR={self._secrets_dir} is not a folder: give the folder "
                                     "the endpoints' secret files are mounted in (in Kubernetes, /var/run/secrets/webhooks)")
        #: The longest wait between two tries of a failing endpoint.
        self._cap_s = _float(env, "WEBHOOK_BACKOFF_CAP_S", 60.0, 0.01)
        #: Seconds between two readings of the registrations (and of MAILQUEUE_WEBHOOKS_FILE).
        self.reload_s = _float(env, "WEBHOOK_RELOAD_S", 5.0, 0.1)
        self._view: View | None = None
        self._broker: RabbitMQBroker | None = None
        self.fleet: EndpointFleet | None = None
        self._reloader: asyncio.Task[None] | None = None

    def servicers(self) -> list[tuple[Callable[[Any, Any], None], Any, str]]:
        return []  # health, reflection and metrics only

    async def connect(self) -> None:
        cassandra, rabbitmq = self.settings.cassandra, self.settings.rabbitmq
        view = await View.open(cassandra)
        broker = RabbitMQBroker(rabbitmq, cassandra.keyspace)
        try:
            # A small prefetch per endpoint: each holds at most this many messages of up to 512 KiB
            # (100, the watchers' default, was 50 MB for an endpoint catching up, and the pod's
            # memory limit is 256 MiB); a batch is at most 10,000 events, about 10 messages.
            stream = RabbitMQEventStream(broker, cassandra.keyspace, rabbitmq, prefetch=WEBHOOK_PREFETCH)
            await stream.declare()  # the stream is reachable
            registry = CassandraWebhooks(view.session, cassandra.keyspace)
            checkpoints, poster = CassandraCheckpoints(view.session, cassandra.keyspace), UrllibPoster()

            loaded = False

            async def load() -> dict[str, tuple[Endpoint, bool]]:
                nonlocal loaded
                wanted = {r.name: (e, r.from_oldest) for r in await registry.all() if (e := endpoint_of(r, self._secrets_dir)) is not None}
                from_file = endpoints_from_file(self._file, running=loaded) if self._file else []
                wanted.update({e.name: (e, oldest) for e, oldest in from_file})
                loaded = True
                return wanted

            async def run(e: Endpoint, from_oldest: bool) -> None:
                await supervise(EndpointDelivery(e, stream, checkpoints, poster, from_oldest=from_oldest, backoff_cap_s=self._cap_s))

            fleet = EndpointFleet(load, run)
            await fleet.reload()  # SERVING only once the endpoints are loaded
        except BaseException:
            # Tried again by the supervisor (until browse_svc has declared the stream, which this
            # role may not): nothing of this attempt stays open.
            await broker.close()
            view.close()
            raise
        self._view, self._broker, self.fleet = view, broker, fleet
        self._reloader = asyncio.create_task(fleet.reload_forever(self.reload_s))
        log.info("delivering events", extra={"endpoints": ",".join(fleet.names), "reload_s": self.reload_s})

    async def check(self) -> None:
        assert self._view is not None and self._broker is not None
        await self._view.ping()
        await self._broker.ping()

    async def close(self) -> None:
        if self._reloader is not None:  # ended first: a reload under way starts no endpoint after the fleet closed
            self._reloader.cancel()
            await asyncio.wait([self._reloader])
        if self.fleet is not None:
            await self.fleet.close()
        if self._broker is not None:
            await self._broker.close()
        if self._view is not None:
            self._view.close()


def main(env: Mapping[str, str] = os.environ) -> None:
    path = _get(env, "WEBHOOKS_FILE", "")
    try:
        if path:
            endpoints_from_file(path)  # a bad file refuses the start at once
    except ConfigurationError as e:
        logs.configure("webhook", logs.level_of(env))
        log.critical("refusing to start: %s", e)
        sys.exit(2)
    server.main(WebhookApp, "webhook")

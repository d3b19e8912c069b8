"""webhook_svc: delivers the event stream to the HTTP endpoints of MAILQUEUE_WEBHOOKS_FILE
(services/app/webhook_delivery.py), each endpoint in a task of its own with a consumer of its own;
checkpoints in Cassandra (``webhook_checkpoints_v1``).

MAILQUEUE_WEBHOOKS_FILE is a JSON array of endpoints::

    [{"name": "billing", "url": "https://billing.example/hooks", "secret_file": "/secrets/billing",
      "queues": ["outbound"], "types": ["delivered", "rejected"], "max_age_s": 86400, "from_oldest": false}]

``name`` keys the checkpoint (renaming an endpoint starts it over); ``secret_file`` holds the HMAC
secret (never in the JSON); ``queues``/``types`` empty or absent: every one; ``from_oldest``: an
endpoint without a checkpoint starts at the oldest event kept instead of the next one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping

from prometheus_client import start_http_server

from services.adapters.cassandra.view import View
from services.adapters.cassandra.webhook_checkpoints import CassandraCheckpoints
from services.adapters.http_poster import UrllibPoster
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
from services.app.webhook_delivery import EndpointDelivery
from services.domain.errors import ConfigurationError
from services.domain.event_stream import EventFilter
from services.domain.events import EventType
from services.domain.webhooks import Endpoint
from services.runtime.logs import configure
from services.runtime.settings import _float, _get, _int, cassandra_from_env, rabbitmq_from_env

log = logging.getLogger("mailqueue.webhooks")

#: Seconds before an endpoint's delivery is started again after its stream or checkpoint failed.
RESTART_S = 2.0


def endpoints_from_file(path: str) -> list[tuple[Endpoint, bool]]:
    """(endpoint, from_oldest) for each entry of the file; ConfigurationError naming what is wrong."""
    try:
        with open(path) as f:
            entries = json.load(f)
        out, names = [], set()
        for entry in entries:
            with open(entry["secret_file"], "rb") as f:
                secret = f.read().strip()
            if not secret or entry["name"] in names or not str(entry["url"]).startswith(("http://", "https://")):
                raise ValueError(f"endpoint {entry['name']!r}: an empty secret, a name used twice, or a URL not http(s)")
            names.add(entry["name"])
            wanted = EventFilter.of(entry.get("queues", ()), [EventType(t) for t in entry.get("types", ())])
            out.append((Endpoint(entry["name"], entry["url"], secret, wanted, float(entry.get("max_age_s", 86400)),
                                 int(entry.get("batch_size", 100)), float(entry.get("timeout_s", 10))),
                        bool(entry.get("from_oldest", False))))
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigurationError(f"MAILQUEUE_WEBHOOKS_FILE={path}: {e}") from e


async def supervise(delivery: EndpointDelivery) -> None:
    """Run one endpoint's delivery for ever: after a backend failure, start again from its checkpoint."""
    while True:
        try:
            await delivery.run()
        except Exception as e:  # noqa: BLE001 - BackendUnavailable mostly; each endpoint keeps going on its own
            log.warning("webhook delivery stopped; starting again from its checkpoint",
                        extra={"endpoint": delivery.endpoint.name, "error": str(e)[:300], "in_s": RESTART_S})
            await asyncio.sleep(RESTART_S)


async def serve(env: Mapping[str, str]) -> None:
    path = _get(env, "WEBHOOKS_FILE", "")
    if not path:
        raise ConfigurationError("MAILQUEUE_WEBHOOKS_FILE is not set: it lists the endpoints to deliver to")
    endpoints = endpoints_from_file(path)
    #: The longest wait between two tries of a failing endpoint.
    cap_s = _float(env, "WEBHOOK_BACKOFF_CAP_S", 60.0, 0.01)
    #: Prometheus metrics (mailqueue_webhook_*) on this port of MAILQUEUE_HOST (0: none).
    metrics_port = _int(env, "METRICS_PORT", 0, 0, 65535)
    if metrics_port:
        start_http_server(metrics_port, addr=_get(env, "HOST", "127.0.0.1"))
    cassandra, rabbitmq = cassandra_from_env(env), rabbitmq_from_env(env)
    view = await View.open(cassandra)
    broker = RabbitMQBroker(rabbitmq, cassandra.keyspace)
    stream = RabbitMQEventStream(broker, cassandra.keyspace, rabbitmq)
    checkpoints, poster = CassandraCheckpoints(view.session, cassandra.keyspace), UrllibPoster()
    log.info("delivering events", extra={"endpoints": ",".join(e.name for e, _ in endpoints)})
    try:
        await asyncio.gather(*(supervise(EndpointDelivery(e, stream, checkpoints, poster, from_oldest=oldest, backoff_cap_s=cap_s))
                               for e, oldest in endpoints))
    finally:
        await broker.close()
        view.close()


def main(env: Mapping[str, str] = os.environ) -> None:
    configure("webhook", env.get("MAILQUEUE_LOG_LEVEL", "INFO"))
    try:
        asyncio.run(serve(env))
    except ConfigurationError as e:
        print(f"webhook: refusing to start: {e}", file=sys.stderr)
        sys.exit(2)

"""The schema step: create the keyspace's tables and grant each service's role what it needs.

    python -m services.runtime.migrate        (console script: mailqueue-schema)

Run with the schema role (MAILQUEUE_CREDENTIALS_DIR holding its cassandra-username and
-password): it owns the keyspace, so the services' roles never hold CREATE, ALTER or DROP.
Idempotent; ``stack/stack.sh up`` runs it for the local keyspace, the init container ``schema``
of the browse pods on Kubernetes, and the tests' harness for each keyspace it makes.
Without authentication (a Cassandra that has none) there is nothing to grant, and services
create the schema themselves as before.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import connect
from services.adapters.cassandra.settings import CassandraSettings
from services.domain.errors import ConfigurationError, MailQueueError
from services.runtime.logs import configure, level_of
from services.runtime.settings import cassandra_from_env

log = logging.getLogger("mailqueue.migrate")

#: The roles stack/provision.py creates, one per component that reads and writes the view.
DEFAULT_ROLES = "mailqueue_enqueue,mailqueue_dequeue,mailqueue_browse,mailqueue_blob,mailqueue_webhook,mailqueue_sweep"


def service_roles(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("MAILQUEUE_CASSANDRA_SERVICE_ROLES", DEFAULT_ROLES)
    return tuple(r.strip() for r in raw.split(",") if r.strip())


def migrate(settings: CassandraSettings, roles: tuple[str, ...]) -> None:
    cluster, session = connect(settings)
    try:
        schema.create(session, settings.keyspace, settings.replication)
        if settings.username:
            schema.grant(session, settings.keyspace, roles)
    finally:
        cluster.shutdown()


def main(env: Mapping[str, str] = os.environ) -> int:
    configure("schema", level_of(env))  # any case, as the services take it
    # A grant given before is a server warning, not news: the step is idempotent.
    logging.getLogger("cassandra.protocol").setLevel(logging.ERROR)
    try:
        settings = cassandra_from_env(env)
        roles = service_roles(env)
        migrate(settings, roles)
    except (ConfigurationError, MailQueueError) as e:
        log.error("schema step failed: %s", e)
        return 1
    log.info("schema ready", extra={"keyspace": settings.keyspace, "granted": ",".join(roles) if settings.username else ""})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The view facade: one Cassandra session, the schema, a DAO per table, and the mail queue view
over them (``mails``, services/adapters/cassandra/mail_queue_view.py) that the domain goes through."""

from __future__ import annotations

import asyncio
import logging

from cassandra.cluster import Cluster, Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.config_store import ConfigStore
from services.adapters.cassandra.counter_buffer import CounterBuffer
from services.adapters.cassandra.counters import CountersDAO
from services.adapters.cassandra.dead_letters_store import DeadLettersStore
from services.adapters.cassandra.deleted_mails import DeletedMailsDAO
from services.adapters.cassandra.enqueued_mails import EnqueuedMailsDAO
from services.adapters.cassandra.enqueuers_store import EnqueuersStore
from services.adapters.cassandra.idempotency import IdempotencyDAO
from services.adapters.cassandra.leases_store import LeasesStore
from services.adapters.cassandra.mail_queue_view import CassandraMailQueueView
from services.adapters.cassandra.moves_store import MovesStore
from services.adapters.cassandra.queues import QueuesDAO
from services.adapters.cassandra.quota_store import QuotaStore
from services.adapters.cassandra.retry_policies import RetryPoliciesDAO
from services.adapters.cassandra.rules import RulesDAO
from services.adapters.cassandra.session import UNAVAILABLE_ERRORS, connect, execute
from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.cassandra.shaping_store import ShapingStore
from services.adapters.cassandra.starts import StartsDAO
from services.domain.errors import BackendUnavailable
from services.ports.view import MailQueueView

log = logging.getLogger(__name__)


class View:
    def __init__(self, cluster: Cluster, session: Session, keyspace: str, counter_flush_s: float = 0.0) -> None:
        self._cluster = cluster
        self.session = session
        self.enqueued = EnqueuedMailsDAO(session, keyspace)
        self.deleted = DeletedMailsDAO(session, keyspace)
        self.starts = StartsDAO(session, keyspace)
        self.queues = QueuesDAO(session, keyspace)
        self.idempotency = IdempotencyDAO(session, keyspace)
        self.enqueuers = EnqueuersStore(session, keyspace)
        self.retry_policies = RetryPoliciesDAO(session, keyspace)
        self.rules = RulesDAO(session, keyspace)
        self.counters = CountersDAO(session, keyspace)
        self.counter_buffer = CounterBuffer(self.counters, counter_flush_s)
        self.config = ConfigStore(session, keyspace)
        self.shaping = ShapingStore(session, keyspace)
        self.quotas = QuotaStore(session, keyspace)
        self.moves = MovesStore(session, keyspace)
        self.leases = LeasesStore(session, keyspace)
        self.dead_letters = DeadLettersStore(session, keyspace)
        #: What the domain uses: the mail rows, their marks and schedules, and the size.
        self.mails: MailQueueView = CassandraMailQueueView(self.enqueued, self.deleted, self.starts, self.counters,
                                                             self.counter_buffer)

    @classmethod
    async def open(cls, settings: CassandraSettings) -> View:
        """Connect, create the schema if missing, prepare statements. Raises BackendUnavailable."""

        def blocking() -> View:
            cluster, session = connect(settings)
            try:
                schema.ensure(cluster, session, settings.keyspace, settings.replication)
                return cls(cluster, session, settings.keyspace, settings.counter_flush_s)
            except UNAVAILABLE_ERRORS as e:
                cluster.shutdown()
                raise BackendUnavailable("cassandra", f"schema set-up failed ({e})") from e
            except schema.SchemaMissing as e:
                cluster.shutdown()
                raise BackendUnavailable("cassandra", str(e)) from e

        return await asyncio.to_thread(blocking)

    async def ping(self) -> None:
        await execute(self.session, "SELECT release_version FROM system.local")

    def close(self) -> None:
        self._cluster.shutdown()

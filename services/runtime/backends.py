"""The backends a service holds: for a queue service the Cassandra view, the broker and the blob
store; for blob_svc the small-blob table and the S3 bucket."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

from services.adapters.blob_service import RemoteBlobStore
from services.adapters.cassandra.blobs import CassandraBlobStore
from services.adapters.cassandra.event_log import CassandraEventLog
from services.adapters.cassandra.view import View
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
from services.adapters.s3.store import S3BlobStore
from services.adapters.tiered import TieredBlobStore
from services.app.queue_state import QueueState
from services.contract import events_serde
from services.domain.errors import BackendUnavailable, ConfigurationError, FailedPrecondition, InvalidArgument
from services.domain.events import Event
from services.domain.view_config import merge
from services.ports.blobstore import BlobStore
from services.ports.broker import Broker
from services.ports.events import EventLog, Unrecorded
from services.runtime.settings import Settings
from services.runtime.tls import channel_credentials

log = logging.getLogger(__name__)


async def blob_store(settings: Settings, view: View) -> BlobStore:
    """Small blobs in the view's Cassandra; larger ones in S3 directly (the default: created if
    missing), or through blob_svc when MAILQUEUE_BLOB_TARGET names it."""
    large: BlobStore
    if settings.server.blob_target:
        large = RemoteBlobStore(settings.server.blob_target, settings.server.service_token,
                                credentials=channel_credentials(settings.server.tls))
    else:
        s3 = S3BlobStore(settings.s3, settings.limits.blob_limit)
        await _bucket_or_later(s3)
        large = s3
    return tiered(settings, view, large)


async def _bucket_or_later(s3: S3BlobStore) -> None:
    """The bucket made sure of; S3 not answering does not stop the start (small content lives in
    Cassandra): the first check that reaches S3 makes sure of it (services/adapters/tiered.py)."""
    try:
        await s3.ensure_bucket()
    except BackendUnavailable as e:
        log.warning("S3 does not answer at start-up: small content is served from Cassandra, large content is "
                    "UNAVAILABLE until S3 answers", extra={"error": str(e)[:300]})
    except BaseException:
        await s3.close()
        raise


def tiered(settings: Settings, view: View, large: BlobStore) -> BlobStore:
    """``large`` behind the small-blob table. MAILQUEUE_SMALL_BLOB_BYTES routes writes only: with 0
    (or a lower value than before) new content goes to ``large``, and what the table holds from
    before stays readable. A blob limit below it routes what is over the limit to ``large``, which
    refuses it (the small table checks no limit)."""
    small = CassandraBlobStore(
        view.session, settings.cassandra.keyspace, min(settings.limits.small_blob_bytes, settings.limits.blob_limit),
        settings.s3.touch_interval_s,
    )
    return TieredBlobStore(small, large)


def event_log(settings: Settings, view: View, stream: RabbitMQEventStream) -> EventLog:
    """Where a service records events: the mail history in the view's Cassandra, then the event
    stream, or nowhere with MAILQUEUE_EVENTS=off."""
    if not settings.events.enabled:
        return Unrecorded()
    replica = f"{socket.gethostname()}/{settings.server.service}" + (f"/{settings.server.worker}" if settings.server.worker else "")
    if settings.events.sinks == "unwritten":
        return Unwritten(replica)
    if settings.events.sinks == "stream":
        return StreamOnly(stream, replica)
    sinks = () if settings.events.sinks == "history" else (stream,)
    # dequeue_svc writes an answer's mark with its event: a change whose event missed the stream is
    # done all the same, and its history rows stay (CassandraEventLog._take_back).
    return CassandraEventLog(view.session, settings.cassandra.keyspace, settings.events.history_retention_s, replica, sinks=sinks,
                             take_back=settings.server.service != "dequeue")


class Unwritten(Unrecorded):
    """MAILQUEUE_EVENTS=unwritten, only to measure: each event is made and encoded as for the
    history and the stream, then dropped (what making events costs, apart from writing them)."""

    def __init__(self, replica: str) -> None:
        self._replica = replica

    async def record(self, events: Sequence[Event]) -> None:
        events_serde.encode_each(events, self._replica)


class StreamOnly(Unrecorded):
    """MAILQUEUE_EVENTS=stream, only to measure: events encoded and published to the stream, no history."""

    def __init__(self, stream: RabbitMQEventStream, replica: str) -> None:
        self._stream, self._replica = stream, replica

    async def record(self, events: Sequence[Event]) -> None:
        await self._stream.record(events, events_serde.encode_each(events, self._replica))


class BlobBackends:
    """blob_svc's backends: the small-blob table in Cassandra and the S3 bucket (created at start-up)."""

    def __init__(self, view: View, store: BlobStore) -> None:
        self.view = view
        self.store = store

    @classmethod
    async def open(cls, settings: Settings) -> BlobBackends:
        s3 = S3BlobStore(settings.s3, settings.limits.blob_limit)
        await _bucket_or_later(s3)
        try:
            view = await View.open(settings.cassandra)
        except BaseException:  # the start-up is tried again every few seconds: nothing left open
            await s3.close()
            raise
        try:
            return cls(view, tiered(settings, view, s3))
        except BaseException:  # the small-blob table prepares its statements: Cassandra may fail here
            view.close()
            await s3.close()
            raise

    async def close(self) -> None:
        await self.store.close()
        self.view.close()


class Backends:
    def __init__(self, view: View, broker: Broker, blobs: BlobStore, stream: RabbitMQEventStream, events: EventLog | None = None,
                 *, queue_cache_s: float) -> None:
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.state = QueueState(view, config_ttl_s=queue_cache_s)
        #: Where every service records its events (services/ports/events.py).
        self.events: EventLog = events if events is not None else Unrecorded()
        #: The event stream (declared on first use; browse_svc declares it at start-up), also a sink of ``events``.
        self.stream = stream

    @classmethod
    async def open(cls, settings: Settings) -> Backends:
        """Connect all three; apply the view configuration from the environment, if any.

        Raises BackendUnavailable (retried by the runtime) or ConfigurationError (start-up refused).
        """
        view = await View.open(settings.cassandra)
        broker: RabbitMQBroker | None = None
        try:
            await apply_view_settings(view, settings)
            broker = RabbitMQBroker(settings.rabbitmq, settings.cassandra.keyspace)
            await broker.ping()
            blobs = await blob_store(settings, view)
            stream = RabbitMQEventStream(broker, settings.cassandra.keyspace, settings.rabbitmq)
            events = event_log(settings, view, stream)
        except BaseException:  # the start-up is tried again every few seconds: nothing left open
            if broker is not None:
                await broker.close()
            view.close()
            raise
        return cls(view, broker, blobs, stream, events, queue_cache_s=settings.queue_cache_s)

    async def check(self) -> None:
        await self.view.ping()
        await self.broker.ping()
        await self.blobs.ping()

    async def close(self) -> None:
        await self.view.counter_buffer.flush()  # a drain (SIGTERM) keeps the gathered counts
        await self.broker.close()
        await self.blobs.close()
        self.view.close()


async def apply_view_settings(view: View, settings: Settings) -> None:
    v = settings.view
    if v.slice_window_s is None and v.bucket_count is None and v.update_browse_start_pace is None:
        return
    wanted = merge(await view.config.current(), v.slice_window_s, v.bucket_count, v.update_browse_start_pace)
    try:
        await view.config.apply(wanted)
    except (FailedPrecondition, InvalidArgument) as e:
        raise ConfigurationError(
            f"the view configuration from the environment is refused: {e}. Fix MAILQUEUE_SLICE_WINDOW_S / "
            "MAILQUEUE_BUCKET_COUNT / MAILQUEUE_BROWSE_START_PACE or unset them to keep the stored configuration"
        ) from e

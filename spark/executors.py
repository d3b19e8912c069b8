"""What runs inside Spark tasks: deletes through the Python Cassandra driver, blob listing and
collection through the minio SDK (services/adapters/s3/client.py; the connector has no DataFrame delete).

Each factory returns a function for ``foreachPartition`` / ``mapPartitions``; it opens its own
connections (they cannot be pickled), works in batches and counts with accumulators.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from services.adapters.cassandra import schema
from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.s3.settings import S3Settings
from services.domain import names, retention
from services.domain.slices import from_ms

BATCH = 2000
CONCURRENCY = 32
BLOB_THREADS = 16


def _execute(cassandra: CassandraSettings, cql: str, params: Iterable[tuple[Any, ...]], counter: Any) -> None:
    from services.adapters.cassandra import bulk
    from services.adapters.cassandra.session import connect

    params = iter(params)
    first = next(params, None)
    if first is None:
        return  # an empty partition (coalesce keeps them): no connection for nothing
    cluster, session = connect(cassandra)
    try:
        statement = session.prepare(cql)
        batch: list[tuple[Any, ...]] = []
        for p in itertools.chain([first], params):
            batch.append(p)
            if len(batch) >= BATCH:
                bulk.run(session, statement, batch, CONCURRENCY)
                counter.add(len(batch))
                batch = []
        if batch:
            bulk.run(session, statement, batch, CONCURRENCY)
            counter.add(len(batch))
    finally:
        cluster.shutdown()


def delete_partitions(cassandra: CassandraSettings, keyspace: str, counter: Any) -> Callable[[Iterator[Any]], None]:
    """Rows of (queue_name, slice_ms, bucket): one partition tombstone each."""
    cql = f"DELETE FROM {keyspace}.{schema.ENQUEUED_MAILS} WHERE queue_name = ? AND slice_start = ? AND bucket = ?"

    def run(rows: Iterator[Any]) -> None:
        _execute(cassandra, cql, ((r.queue_name, from_ms(r.slice_ms), r.bucket) for r in rows), counter)

    return run


def delete_marks(cassandra: CassandraSettings, keyspace: str, counter: Any) -> Callable[[Iterator[Any]], None]:
    """Rows of (queue_name, enqueue_id): the deleted marks to drop."""
    import uuid

    cql = f"DELETE FROM {keyspace}.{schema.DELETED_MAILS} WHERE queue_name = ? AND enqueue_id = ?"

    def run(rows: Iterator[Any]) -> None:
        _execute(cassandra, cql, ((r.queue_name, uuid.UUID(r.enqueue_id)) for r in rows), counter)

    return run


def record_swept(cassandra: CassandraSettings, keyspace: str, ttl_s: int, at: dt.datetime, replica: str,
                 counter: Any) -> Callable[[Iterator[Any]], None]:
    """Rows of (queue_name, enqueue_id, slice_ms): one SWEPT event each in the mail history (actor
    the component ``sweep``), written before the mail's row is deleted. Its id is derived from the
    mail (services/domain/events.py ``event_id``): a run killed before the delete and run again
    writes the same id, and the history keeps one row. Written ``USING TTL`` the history retention
    like every event; pipelined (``bulk.run``: 32 requests in flight), never a wait per event."""
    import uuid

    from services.domain.events import SWEEP, EventType, event_id

    cql = (f"INSERT INTO {keyspace}.{schema.MAIL_HISTORY} (enqueue_id, event_id, at, type, queue_name, reason, "
           "replica, actor_kind, actor_identity) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")

    def params(r: Any) -> tuple[Any, ...]:
        reason = f"slice {from_ms(r.slice_ms).isoformat()} removed by the retention sweep"
        return (uuid.UUID(r.enqueue_id), event_id(EventType.SWEPT, r.queue_name, uuid.UUID(r.enqueue_id)), at,
                EventType.SWEPT.value, r.queue_name, reason, replica, SWEEP.kind, SWEEP.identity, ttl_s)

    def run(rows: Iterator[Any]) -> None:
        _execute(cassandra, cql, (params(r) for r in rows), counter)

    return run


def _ms(instant: Any) -> int:
    return int(instant.timestamp() * 1000)


def list_blobs(s3: S3Settings, started: dt.datetime, grace: dt.timedelta) -> Callable[[Iterator[str]], Iterator[tuple[str, int, int]]]:
    """Key prefixes in, (blob_id, size, last_modified_ms) out for blobs old enough to collect."""

    def run(prefixes: Iterator[str]) -> Iterator[tuple[str, int, int]]:
        from services.adapters.s3 import client as s3client

        bucket = s3client.Bucket(s3)
        for prefix in prefixes:
            for o in bucket.objects(prefix):
                if retention.blob_collectable(o.last_modified, started, grace):
                    yield o.key.rsplit("/", 1)[-1], o.size, _ms(o.last_modified)

    return run


def delete_blobs(s3: S3Settings, started: dt.datetime, grace: dt.timedelta, count: Any, size: Any) -> Callable[[Iterator[Any]], None]:
    """Unreferenced blobs in: each is stat'ed again right before its delete, and kept when it
    was written (or touched by an enqueue deduplicating onto it) since the listing."""

    def run(rows: Iterator[Any]) -> None:
        from services.adapters.s3 import client as s3client
        from services.adapters.s3 import errors as s3errors

        bucket = s3client.Bucket(s3)

        def collect(blob_id: str) -> None:
            key = names.blob_key(blob_id)
            try:
                st = bucket.head(key)
            except s3errors.ERRORS as e:
                if s3errors.is_missing(e):
                    return
                raise
            if not retention.blob_collectable(st.last_modified, started, grace):
                return
            bucket.remove(key)
            count.add(1)
            size.add(st.size)

        with concurrent.futures.ThreadPoolExecutor(BLOB_THREADS) as pool:
            for f in [pool.submit(collect, r.blob_id) for r in rows]:
                f.result()

    return run


def delete_small_blobs(cassandra: CassandraSettings, keyspace: str, cutoff: dt.datetime, count: Any, size: Any) -> Callable[[Iterator[Any]], None]:
    """Rows of (blob_id, size) from the small-blob table: each deleted only if it was still
    last written before ``cutoff`` (a conditional delete: a put that reused the blob since the
    listing keeps it)."""
    cql = f"DELETE FROM {keyspace}.{schema.BLOBS} WHERE blob_id = ? IF written_at < ?"

    def run(rows: Iterator[Any]) -> None:
        from services.adapters.cassandra import bulk
        from services.adapters.cassandra.session import connect

        cluster, session = connect(cassandra)
        try:
            statement = session.prepare(cql)
            batch = list(rows)
            for i in range(0, len(batch), BATCH):
                part = batch[i:i + BATCH]
                results = bulk.run(session, statement, [(r.blob_id, cutoff) for r in part], CONCURRENCY)
                for r, result in zip(part, results):
                    if result and result[0][0]:  # [applied]
                        count.add(1)
                        size.add(int(r.size or 0))
        finally:
            cluster.shutdown()

    return run


def blob_prefixes() -> list[str]:
    """Blob keys are ``blobs/<sha-256 hex>``: 256 two-digit prefixes split the listing evenly."""
    return [f"{names.blob_key('')}{i:02x}" for i in range(256)]

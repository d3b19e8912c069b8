"""The baseline of the sweep benchmark: the same sweep as spark/sweep.py, written the plain way,
one Python process with the Cassandra driver (concurrent requests) and the S3 client.

It walks each queue's slices × buckets from content start instead of scanning the table, and
uses the same rules (services/domain/retention.py). Not used in production.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
from collections.abc import Iterable

from services.adapters.cassandra import bulk
from services.adapters.cassandra.session import connect
from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.cassandra.view import View
from services.adapters.s3 import client as s3client
from services.adapters.s3.settings import S3Settings
from services.domain import names, retention, slices

CONCURRENCY = 32


def _results(session, statement, params: list[tuple]) -> Iterable:
    return bulk.run(session, statement, params, CONCURRENCY)


def sweep(cassandra: CassandraSettings, s3: S3Settings, grace: dt.timedelta, blob_grace: dt.timedelta) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    loop = asyncio.new_event_loop()
    view = loop.run_until_complete(View.open(cassandra))
    config = loop.run_until_complete(view.config.current())
    window, buckets = config.slice_window, config.bucket_count
    cluster, session = connect(cassandra)
    ks = cassandra.keyspace
    read_partition = session.prepare(
        f"SELECT enqueue_id, blob_ids FROM {ks}.enqueued_mails_v1 WHERE queue_name = ? AND slice_start = ? AND bucket = ?"
    )
    read_mark = session.prepare(f"SELECT deleted_at FROM {ks}.deleted_mails_v1 WHERE queue_name = ? AND enqueue_id = ?")
    delete_mark = session.prepare(f"DELETE FROM {ks}.deleted_mails_v1 WHERE queue_name = ? AND enqueue_id = ?")
    delete_partition = session.prepare(
        f"DELETE FROM {ks}.enqueued_mails_v1 WHERE queue_name = ? AND slice_start = ? AND bucket = ?"
    )
    summary = {"rows": 0, "marks": 0, "partitions": 0, "blobs": 0}
    referenced: set[str] = set()
    for queue in loop.run_until_complete(view.queues.all()):
        p = retention.plan(
            queue, loop.run_until_complete(view.starts.browse_start(queue)),
            loop.run_until_complete(view.starts.content_start(queue)), grace, window,
        )
        if p is None:
            continue
        first = p.content_start or p.drop_before
        keys = [(queue, s, b) for s in slices.slices_between(first, p.drop_before - window, window) for b in range(buckets)]
        keys = [k for k in keys if k[1] < p.drop_before]
        rows = [(k, list(r)) for k, r in zip(keys, _results(session, read_partition, keys))]
        candidates = [(k[1], r.enqueue_id) for k, rs in rows for r in rs]
        marked = [bool(list(m)) for m in _results(session, read_mark, [(queue, eid) for _, eid in candidates])]
        live = [sl for (sl, _), m in zip(candidates, marked) if not m]
        target = retention.new_content_start(p, min(live) if live else None)
        target = loop.run_until_complete(view.starts.advance_content_start(queue, target))
        doomed = [(queue, eid) for (sl, eid), m in zip(candidates, marked) if m and sl < target]
        list(_results(session, delete_mark, doomed))
        dead_partitions = [k for k, rs in rows if rs and k[1] < target]
        list(_results(session, delete_partition, dead_partitions))
        summary["rows"] += sum(len(rs) for k, rs in rows if k[1] < target)
        summary["marks"] += len(doomed)
        summary["partitions"] += len(dead_partitions)
        remaining = [(queue, s, b) for s in slices.slices_between(target, started + window, window) for b in range(buckets)]
        for rs in _results(session, read_partition, remaining):
            for r in rs:
                referenced.update(r.blob_ids or ())
    cluster.shutdown()
    view.close()
    loop.close()

    bucket = s3client.Bucket(s3)
    garbage = [
        o for o in bucket.objects(names.blob_key(""))
        if retention.blob_collectable(o.last_modified, started, blob_grace) and o.key.rsplit("/", 1)[-1] not in referenced
    ]

    def collect(o: s3client.Object) -> None:
        if retention.blob_collectable(bucket.head(o.key).last_modified, started, blob_grace):
            bucket.remove(o.key)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(collect, garbage))
    summary["blobs"] = len(garbage)
    return summary

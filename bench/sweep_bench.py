"""Retention sweep benchmark (#6): the Spark job vs. a plain single-process Python driver sweep.

    .venv/bin/python -m bench.sweep_bench --dead 1000000 --live 1000

Two keyspaces (and two buckets) get the same data: ``--dead`` dequeued mails (rows + deleted
marks) spread over 1-minute slices and 10 buckets before browse start, ``--live`` live mails
after it; dead mails reference 1,000 blobs of their own, live mails 1,000 others. Then the Spark
sweep (``python -m spark.sweep``, local mode, end to end including JVM start-up) runs on one and
the plain sweep (bench/plain_sweep.py) on the other; both are checked to end in the same state.
Keyspaces and buckets are dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from bench import plain_sweep
from bench.common import ROOT
from services.adapters.cassandra.session import connect
from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.cassandra.view import View
from services.adapters.s3 import client as s3client
from services.adapters.s3.settings import S3Settings
from services.domain import model, slices
from services.runtime.settings import cassandra_from_env, s3_from_env

WINDOW = dt.timedelta(minutes=1)
BUCKETS = 10
QUEUE = "bench"
BLOBS = 1000


def blob_id(kind: str, i: int) -> str:
    return f"{0xd if kind == 'dead' else 0xe:x}{i:063x}"  # 64 hex digits, like a SHA-256


def populate(cassandra: CassandraSettings, s3: S3Settings, dead: int, live: int, now: dt.datetime) -> dt.datetime:
    """Write the data set; returns browse start."""
    loop = asyncio.new_event_loop()
    view = loop.run_until_complete(View.open(cassandra))
    loop.run_until_complete(view.config.apply(model.ViewConfig(WINDOW, BUCKETS, 1000)))
    browse_start = slices.slice_start(now - dt.timedelta(minutes=5), WINDOW)
    per_partition = 100
    partitions = max(1, dead // per_partition)
    first_slice = browse_start - WINDOW * (partitions // BUCKETS + 2)
    loop.run_until_complete(view.queues.create(QUEUE))
    loop.run_until_complete(view.starts.initialise(QUEUE, first_slice))
    loop.run_until_complete(view.starts.set_browse_start(QUEUE, browse_start))
    view.close()
    loop.close()

    cluster, session = connect(cassandra)
    ks = cassandra.keyspace
    insert_row = session.prepare(
        f"INSERT INTO {ks}.enqueued_mails_v1 (queue_name, slice_start, bucket, enqueued_at, enqueue_id, name, sender, "
        "recipients, blob_ids, size) VALUES (?, ?, ?, ?, ?, 'bench', 'a@example.com', ['b@example.org'], ?, 10240)"
    )
    insert_mark = session.prepare(
        f"INSERT INTO {ks}.deleted_mails_v1 (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, 'dequeued', ?)"
    )
    batches: list[BatchStatement] = []
    marks: list[tuple] = []
    n = 0
    for p in range(partitions):
        sl = first_slice + WINDOW * (p // BUCKETS)
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for _ in range(min(per_partition, dead - n)):
            eid = uuid.uuid4()
            batch.add(insert_row, (QUEUE, sl, p % BUCKETS, sl, eid, [blob_id("dead", n % BLOBS)]))
            marks.append((QUEUE, eid, sl + WINDOW))
            n += 1
        batches.append(batch)
    for i in range(live):
        sl = browse_start + WINDOW * (i % 3)
        batches.append(_single(insert_row, (QUEUE, sl, i % BUCKETS, sl, uuid.uuid4(), [blob_id("live", i % BLOBS)])))
    for i in range(0, len(marks), 50):  # marks: one partition each, written 50 to a batch
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for m in marks[i:i + 50]:
            batch.add(insert_mark, m)
        batches.append(batch)
    t = time.monotonic()
    _write_all(session, batches)
    cluster.shutdown()
    bucket = s3client.Bucket(s3)
    if not bucket.exists():
        bucket.create()
    for kind in ("dead", "live"):
        for i in range(BLOBS):
            bucket.put(f"blobs/{blob_id(kind, i)}", b"x" * 100)
    print(f"  {ks}: {n} dead rows + marks, {live} live rows, {2 * BLOBS} blobs written in {time.monotonic() - t:.0f} s", flush=True)
    return browse_start


def _write_all(session, batches: list[BatchStatement]) -> None:
    """Every batch, 16 at a time; those that time out (Cassandra busy flushing) are retried."""
    pending = batches
    for _attempt in range(5):
        results = execute_concurrent(session, [(b, ()) for b in pending], concurrency=16, raise_on_first_error=False)
        pending = [b for b, (ok, _) in zip(pending, results) if not ok]
        if not pending:
            return
        print(f"  retrying {len(pending)} batches", flush=True)
    raise SystemExit("Cassandra kept timing out while the data set was written")


def _single(statement, params) -> BatchStatement:
    b = BatchStatement(batch_type=BatchType.UNLOGGED)
    b.add(statement, params)
    return b


def drop(cassandra: CassandraSettings, s3: S3Settings) -> None:
    cluster, session = connect(cassandra)
    session.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}", timeout=120)
    cluster.shutdown()
    bucket = s3client.Bucket(s3)
    if bucket.exists():
        bucket.drop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dead", type=int, default=1_000_000)
    ap.add_argument("--live", type=int, default=1000)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()
    tag = uuid.uuid4().hex[:8]
    now = dt.datetime.now(dt.timezone.utc)
    spark_env = dict(os.environ, MAILQUEUE_CASSANDRA_KEYSPACE=f"mq_bench_sweep_spark_{tag}", MAILQUEUE_S3_BUCKET=f"mq-bench-sweep-spark-{tag}")
    plain_env = dict(os.environ, MAILQUEUE_CASSANDRA_KEYSPACE=f"mq_bench_sweep_plain_{tag}", MAILQUEUE_S3_BUCKET=f"mq-bench-sweep-plain-{tag}")
    settings = {name: (cassandra_from_env(e), s3_from_env(e)) for name, e in (("spark", spark_env), ("plain", plain_env))}
    print(f"populating two keyspaces with {a.dead} dead and {a.live} live mails each", flush=True)
    try:
        for cassandra, s3 in settings.values():
            populate(cassandra, s3, a.dead, a.live, now)

        t = time.monotonic()
        summary_path = os.path.join(ROOT, ".stack", f"bench-sweep-{tag}.json")
        subprocess.run(
            [sys.executable, "-m", "spark.sweep", "--master", a.master, "--grace", "0s", "--blob-grace", "0s",
             "--summary-file", summary_path],
            cwd=ROOT, env=spark_env, check=True,
        )
        spark_s = time.monotonic() - t
        with open(summary_path, encoding="utf-8") as f:
            spark_summary = json.load(f)
        os.unlink(summary_path)

        t = time.monotonic()
        plain_summary = plain_sweep.sweep(*settings["plain"], grace=dt.timedelta(0), blob_grace=dt.timedelta(0))
        plain_s = time.monotonic() - t

        keys = ("rows", "marks", "partitions", "blobs")
        print(f"\nspark sweep ({a.master}): {spark_s:.1f} s, {spark_summary['rows'] / spark_s:,.0f} rows/s  "
              + ", ".join(f"{k} {spark_summary[k]}" for k in keys))
        print(f"plain python sweep:   {plain_s:.1f} s, {plain_summary['rows'] / plain_s:,.0f} rows/s  "
              + ", ".join(f"{k} {plain_summary[k]}" for k in keys))
        print(f"ratio spark / plain (rows per second): {plain_s / spark_s:.2f}")
        assert all(spark_summary[k] == plain_summary[k] for k in keys), "the two sweeps disagree"
    finally:
        for cassandra, s3 in settings.values():
            drop(cassandra, s3)


if __name__ == "__main__":
    main()

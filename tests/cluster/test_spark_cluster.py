"""The retention sweep on a Spark standalone cluster (a master and two workers, started by
stack/stack.sh up --cluster from what the pyspark package ships) against the 3-node Cassandra:
the run on the cluster deletes every row of the settled slices and every blob, and leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2_grpc
from stack.harness import ROOT, wait_until
from tests.cluster.conftest import ClusterServices
from tests.integration.helpers import StreamConsumer, inline, simple_mail
from tests.integration.test_browse_admin import next_slice

#: What depends on the run itself, not on the data.
RUN_FIELDS = ("duration_s",)


def sweep(env: dict[str, str], master: str, *args: str) -> dict:
    summary = os.path.join(ROOT, ".stack", f"sweep-{uuid.uuid4().hex[:8]}.json")
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "spark.sweep", "--master", master, "--grace", "0s", "--blob-grace", "0s",
         "--summary-file", summary, *args],
        cwd=ROOT, env={**env, "MAILQUEUE_SPARK_JAVA_OPTIONS": "quick"}, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    with open(summary, encoding="utf-8") as f:
        result = json.load(f)
    os.unlink(summary)
    print(f"\n[cluster] sweep on {master} {' '.join(args)}: {time.monotonic() - started:.1f} s wall, {result}")
    return {k: v for k, v in result.items() if k not in RUN_FIELDS}


def left_behind(env: dict[str, str], queue: str) -> tuple[int, int]:
    """(rows of the queue in enqueued_mails, blobs in the bucket)."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.adapters.s3.client import Bucket
    from services.runtime.settings import cassandra_from_env, s3_from_env

    settings = cassandra_from_env(env)
    cluster, session = connect(settings)
    try:
        rows = session.execute(f"SELECT count(*) FROM {settings.keyspace}.{schema.ENQUEUED_MAILS} WHERE queue_name = %s ALLOW FILTERING",
                               (queue,)).one()[0]
    finally:
        cluster.shutdown()
    bucket = Bucket(s3_from_env(env))
    return rows, sum(1 for _ in bucket.client.list_objects(bucket.name, prefix="blobs/", recursive=True))


@pytest.mark.timeout(900)
def test_sweep_on_a_standalone_cluster_deletes_every_dead_row_and_blob(cluster_env):
    bucket = f"mq-cluster-sweep-{uuid.uuid4().hex[:8]}"
    s = ClusterServices(cluster_env, MAILQUEUE_SLICE_WINDOW_S="1", MAILQUEUE_BROWSE_START_PACE="1000000",
                        MAILQUEUE_S3_BUCKET=bucket, MAILQUEUE_S3_TOUCH_INTERVAL_S="0", MAILQUEUE_SMALL_BLOB_BYTES="0")
    try:
        queue = s.new_queue()
        enqueue = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(s.enqueue.target))
        for i in range(30):  # 6 per 1-second slice (5 slices), each mail with a blob of its own
            if i and i % 6 == 0:
                next_slice()
            enqueue.Enqueue(inline(queue, simple_mail(f"m{i}"), f"Subject: {i}\r\n\r\nbody {i}".encode()), timeout=30)
        consumer = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(s.dequeue.target)), queue, 30)
        consumer.answer_all(consumer.take(30))
        consumer.close()
        browse = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(s.browse.target))
        wait_until(lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True), timeout=30).size == 0, 60,
                   what="every mail settled")
        # Browse start moves past the settled slices once they are a slice window old.
        last = time.time()
        admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(s.browse.target))
        wait_until(lambda: admin.UpdateBrowseStart(admin_pb2.UpdateBrowseStartRequest(queue=queue), timeout=30)
                   .browse_start.seconds > last, 30, interval=0.5, what="browse start past the mails")
        env = dict(s.env)
        rows, blobs = left_behind(env, queue)
        assert rows == 30 and blobs >= 30, (rows, blobs)
        # The run on the cluster finds and deletes exactly the 30 rows of the settled slices (5, or more if a slice's mails straddled a boundary) and
        # every blob (local mode's plan of the same kind of data is checked in test_sweep, run by
        # run; a local dry run here cost a second Spark start, 100-150 s on the 2-core machine).
        done = sweep(env, cluster_env["MAILQUEUE_SPARK_MASTER"], "--queue", queue)
        assert done["dry_run"] is False
        assert (done["rows"], done["blobs"]) == (30, blobs) and done["slices"] >= 5, done  # 6 a slice, unless one straddled
        # Nothing is left: no row of the queue's time series, no blob in the bucket (read straight
        # from Cassandra and MinIO: a second sweep would cost a Spark start, 84 s under load).
        assert left_behind(env, queue) == (0, 0)
    finally:
        s.stop(drop=True)

"""Cheap size: GetSize from the counters vs the exact count, on a queue with a long history, and
the CPU of the gauge export.

    .venv/bin/python -m bench.size_bench [--history 1000000] [--live 100] [--slice-window 60]

The history (mails enqueued and dequeued: rows, deleted marks and their counters, spread over
``--history-slices`` past slices) is written in bulk with the driver, as enqueue and dequeue
would have left it; browse start is set past it, as UpdateBrowseStart does once it is drained.
The live mails are enqueued through gRPC. Then browse_svc answers GetSize both ways through
gRPC, 20 times each: median latency and rows read (its own metrics). Last, its CPU over
``--idle`` seconds with the gauges refreshed every ``--gauge-interval`` seconds, and with them off.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
import uuid

import grpc
from cassandra.concurrent import execute_concurrent_with_args

from bench.common import PORTS, ROOT, bench_queue, cpu_seconds, env, new_keyspace, run, serving, start_services, stop
from bench.common import metric as common_metric
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from services.adapters.cassandra import schema
from services.adapters.cassandra.session import connect
from services.domain.slices import slice_start
from services.runtime.settings import cassandra_from_env

METRICS_PORT = 56153


def write_history(keyspace: str, queue: str, history: int, slices: int, window: dt.timedelta) -> dt.datetime:
    """Rows, marks and counters of ``history`` dequeued mails over ``slices`` past slices; the
    slice the live mails will go to (browse start)."""
    cluster, session = connect(cassandra_from_env({**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace}))
    try:
        now = dt.datetime.now(dt.timezone.utc)
        live_slice = slice_start(now, window)
        first = live_slice - slices * window
        rows = session.prepare(
            f"INSERT INTO {keyspace}.{schema.ENQUEUED_MAILS} (queue_name, slice_start, bucket, enqueued_at, enqueue_id, "
            "name, sender, recipients, blob_ids, size) VALUES (?, ?, 0, ?, ?, 'history', 'a@example.com', ['b@example.org'], ?, 1024)")
        marks = session.prepare(
            f"INSERT INTO {keyspace}.{schema.DELETED_MAILS} (queue_name, enqueue_id, reason, deleted_at) VALUES (?, ?, 'dequeued', ?)")
        counter = session.prepare(
            f"UPDATE {keyspace}.{schema.COUNTERS} SET count = count + ? WHERE queue_name = ? AND kind = ? AND slice_start = ?")
        per_slice = history // slices
        began = time.monotonic()
        for s in range(slices):
            start = first + s * window
            ids = [uuid.uuid4() for _ in range(per_slice)]
            at = [start + dt.timedelta(milliseconds=i % int(window.total_seconds() * 1000)) for i in range(per_slice)]
            execute_concurrent_with_args(session, rows, [(queue, start, t, i, ["0" * 64]) for t, i in zip(at, ids)], concurrency=128)
            execute_concurrent_with_args(session, marks, [(queue, i, t) for t, i in zip(at, ids)], concurrency=128)
            for kind in ("enqueued", "gone"):
                session.execute(counter, (per_slice, queue, kind, start))
            if s % max(1, slices // 10) == 0:
                print(f"  [history] {(s + 1) * per_slice} of {history} after {time.monotonic() - began:.0f} s", file=sys.stderr)
        session.execute(f"UPDATE {keyspace}.{schema.BROWSE_START} SET browse_start = %s WHERE queue_name = %s", (live_slice, queue))
        return live_slice
    finally:
        cluster.shutdown()


def metric(name: str) -> float:
    return common_metric(METRICS_PORT, name)


def browse_process(keyspace: str, gauge_interval: float) -> subprocess.Popen:
    e = env(keyspace, "browse")
    e.update({"MAILQUEUE_METRICS_PORT": str(METRICS_PORT), "MAILQUEUE_GAUGE_INTERVAL_S": str(gauge_interval)})
    proc = subprocess.Popen([sys.executable, "-m", "browse_svc"], cwd=ROOT, env=e)
    while not serving(f"127.0.0.1:{PORTS['browse']}"):
        time.sleep(0.2)
    return proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=int, default=1_000_000)
    p.add_argument("--history-slices", type=int, default=100)
    p.add_argument("--live", type=int, default=100)
    p.add_argument("--slice-window", type=int, default=60, help="seconds")
    p.add_argument("--idle", type=float, default=60)
    p.add_argument("--gauge-interval", type=float, default=15)
    a = p.parse_args()
    keyspace = new_keyspace()
    os.environ["MAILQUEUE_SLICE_WINDOW_S"] = str(a.slice_window)
    queue = bench_queue("bench-size")
    procs = start_services(keyspace, ["blob", "enqueue"])
    browse = browse_process(keyspace, 0)
    try:
        admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}")).CreateQueue(
            admin_pb2.CreateQueueRequest(queue=queue))
        write_history(keyspace, queue, a.history, a.history_slices, dt.timedelta(seconds=a.slice_window))
        enqueue = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}"))
        for i in range(a.live):
            enqueue.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, mail=mail_pb2.Mail(
                name=f"live-{i}", sender="a@example.com", recipients=["b@example.org"]), inline_content=b"Subject: live\r\n\r\nx"))
        stub = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
        results = {}
        for label, exact in (("counters", False), ("exact", True)):
            stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=exact))  # warm-up
            rows0, marks0 = metric("mailqueue_view_rows_read_total"), metric("mailqueue_view_marks_read_total")
            times, size = [], 0
            for _ in range(20):
                t = time.perf_counter()
                size = stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=exact)).size
                times.append(1000 * (time.perf_counter() - t))
            rows = (metric("mailqueue_view_rows_read_total") - rows0) / 20
            marks = (metric("mailqueue_view_marks_read_total") - marks0) / 20
            results[label] = (size, statistics.median(times), rows, marks)
        browse.terminate()
        browse.wait(20)
        idle = {}
        for label, interval in (("gauges off", 0), (f"gauges every {a.gauge_interval:g} s", a.gauge_interval)):
            browse = browse_process(keyspace, interval)
            time.sleep(2)  # start-up settles; then idle CPU is all there is to measure
            c0 = cpu_seconds(browse.pid)
            time.sleep(a.idle)
            idle[label] = 100 * (cpu_seconds(browse.pid) - c0) / a.idle
            refresh = metric("mailqueue_queue_gauges_refresh_seconds")
            browse.terminate()
            browse.wait(20)
    finally:
        if browse.poll() is None:
            browse.terminate()
        stop(procs)
    print(f"\nqueue with {a.history} mails of history over {a.history_slices} slices of {a.slice_window} s, "
          f"{a.live} live; keyspace {keyspace}")
    for label, (size, ms, rows, marks) in results.items():
        print(f"GetSize {label:<9} -> {size:>5}  median {ms:6.1f} ms  mail rows read {rows:.0f}, marks read {marks:.0f} per call")
    print("browse_svc idle CPU: " + ", ".join(f"{k} {v:.2f}%" for k, v in idle.items())
          + f"; last gauge refresh took {1000 * refresh:.1f} ms")


if __name__ == "__main__":
    run(main)

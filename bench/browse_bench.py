"""Browse and size cost on a queue with a long history: 20,000 mails enqueued and dequeued, 100 live.

    .venv/bin/python -m bench.browse_bench [--history 20000] [--live 100] [--slice-window 1]

The history is written and drained with the domain code directly (fast, not timed); then
browse_svc answers GetSize and a full Browse through gRPC. Rows read from Cassandra are counted
by browse_svc's own metrics (mailqueue_view_rows_read_total, mailqueue_view_marks_read_total).
Target: rows read <= 2 x (live mails + deleted mails in the live slices); each call < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import grpc

from bench.common import PORTS, bench_queue, blob_store, env, new_keyspace, run, serving
from bench.common import metric as common_metric
from bench.enqueue_bench import content
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc
from services.adapters.cassandra.view import View
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.app.dequeuer import Dequeuer
from services.app.enqueuer import Enqueuer, Inline
from services.app.queue_state import QueueState
from services.app.queues import create_queue
from services.app.subscription import Outcome
from services.domain import model
from services.runtime.backends import apply_view_settings
from services.runtime.settings import Settings

QUEUE = bench_queue("bench-browse")
METRICS_PORT = 56153


async def write_history(settings: Settings, history: int, live: int) -> None:
    view = await View.open(settings.cassandra)
    await apply_view_settings(view, settings)  # the short slice window of --slice-window
    broker = RabbitMQBroker(settings.rabbitmq)
    blobs = await blob_store(settings, view)
    state = QueueState(view)
    await create_queue(view, broker, QUEUE)
    enqueuer = Enqueuer(view, broker, blobs, settings.limits, state)
    mail = model.Mail(name="bench", sender="a@example.com", recipients=("b@example.org",))
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await enqueuer.enqueue(QUEUE, mail, Inline(content(i, 1024)))

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(history)))
    print(f"  enqueued {history} in {time.monotonic() - started:.0f}s", file=sys.stderr)
    sub = await Dequeuer(view, broker, blobs, settings.limits, state).subscribe(QUEUE, 64)
    tasks = set()
    for i in range(history):
        d = await sub.next()
        t = sub.settle(d.tag, Outcome.SUCCESS)  # begun at once; its future
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        if i % 5000 == 4999:
            print(f"  dequeued {i + 1}", file=sys.stderr)
    print("  settling the last outcomes", file=sys.stderr)
    await asyncio.gather(*tasks)
    await sub.close()
    print("  drained", file=sys.stderr)
    # Let the drained slices fall behind the window before the live mails arrive.
    window = (await view.config.current()).slice_window.total_seconds()
    await asyncio.sleep(2 * window)
    await asyncio.gather(*(one(i) for i in range(live)))
    print(f"  {live} live mails enqueued", file=sys.stderr)
    await asyncio.sleep(2 * window)
    await broker.close()
    view.close()


def metric(name: str) -> float:
    return common_metric(METRICS_PORT, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=int, default=20000)
    p.add_argument("--live", type=int, default=100)
    p.add_argument("--slice-window", type=int, default=1, help="seconds")
    a = p.parse_args()
    keyspace = new_keyspace()
    base = {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace, "MAILQUEUE_SLICE_WINDOW_S": str(a.slice_window)}
    settings = Settings.from_env("browse", base)
    asyncio.run(write_history(settings, a.history, a.live))
    import subprocess

    e = env(keyspace, "browse")
    e.update({"MAILQUEUE_METRICS_PORT": str(METRICS_PORT), "MAILQUEUE_SLICE_WINDOW_S": str(a.slice_window),
              "MAILQUEUE_BLOB_TARGET": ""})  # browse reads S3 directly here: no blob_svc in this bench
    import bench.common as common

    proc = subprocess.Popen([sys.executable, "-m", "browse_svc"], cwd=common.ROOT, env=e)
    try:
        while not serving(f"127.0.0.1:{PORTS['browse']}"):
            time.sleep(0.2)
        channel = grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}")
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        browse = browse_pb2_grpc.BrowseServiceStub(channel)
        start = admin.UpdateBrowseStart(admin_pb2.UpdateBrowseStartRequest(queue=QUEUE)).browse_start.ToDatetime()
        browse.GetSize(browse_pb2.GetSizeRequest(queue=QUEUE))  # warm-up: prepared statements, connections
        results = {}
        for label, call in (
            ("GetSize", lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=QUEUE)).size),
            ("Browse", lambda: len(list(browse.Browse(browse_pb2.BrowseRequest(queue=QUEUE))))),
        ):
            rows0, marks0 = metric("mailqueue_view_rows_read_total"), metric("mailqueue_view_marks_read_total")
            t = time.perf_counter()
            n = call()
            ms = 1000 * (time.perf_counter() - t)
            rows, marks = metric("mailqueue_view_rows_read_total") - rows0, metric("mailqueue_view_marks_read_total") - marks0
            results[label] = (n, ms, rows, marks)
        print(f"\nqueue with {a.history} mails enqueued and dequeued, {a.live} live, slice window {a.slice_window}s; "
              f"browse start {start.isoformat()}Z; keyspace {keyspace}")
        for label, (n, ms, rows, marks) in results.items():
            print(f"{label:<8} -> {n:>6} live  {ms:7.1f} ms  rows read {rows:.0f} + deleted marks read {marks:.0f}")
    finally:
        proc.terminate()
        proc.wait(20)


if __name__ == "__main__":
    run(main)

"""Priorities: how fast a high-priority mail gets through a backlog of normal ones.

    .venv/bin/python -m bench.priority_bench [--backlog 10000] [--high 20] [--prefetch 32]

A backlog of ``--backlog`` normal 10 KiB mails is written first (with the services' own code,
in-process, to save time), then one consumer drains it through gRPC (SUCCESS, ``--prefetch``)
while ``--high`` high-priority mails are enqueued through gRPC, one every 0.5 s. Reported: the
latency of each high mail from its Enqueue call to its delivery (p50, max), where the normal
backlog stood meanwhile, and the normal throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import grpc

from bench.common import PORTS, bench_queue, new_keyspace, run, start_services, stop, write_backlog
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from services.runtime.settings import Settings

SIZE = 10 * 1024


async def measure(queue: str, high: int, prefetch: int) -> dict:
    enq_ch = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}")
    deq_ch = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}")
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(enq_ch)
    sent: dict[str, float] = {}
    latency: list[float] = []
    normals_at: list[int] = []
    normal = 0
    outcomes: asyncio.Queue = asyncio.Queue()
    await outcomes.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=prefetch)))
    done = asyncio.Event()

    async def requests():
        while (item := await outcomes.get()) is not None:
            yield item

    async def consume() -> None:
        nonlocal normal
        async for r in dequeue_pb2_grpc.DequeueServiceStub(deq_ch).Dequeue(requests()):
            if r.WhichOneof("kind") != "delivery":
                continue
            d = r.delivery
            if d.mail.priority == mail_pb2.PRIORITY_HIGH:
                latency.append(time.monotonic() - sent[d.mail.mail.name])
                normals_at.append(normal)
                if len(latency) == high:
                    done.set()
            else:
                normal += 1
            await outcomes.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
                delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))

    consumer = asyncio.create_task(consume())
    began = time.monotonic()
    await asyncio.sleep(2)  # let the consumer reach its steady state on the backlog
    for i in range(high):
        name = f"high-{i}"
        sent[name] = time.monotonic()
        await enqueue.Enqueue(enqueue_pb2.EnqueueRequest(
            queue=queue, mail=mail_pb2.Mail(name=name, sender="a@example.com", recipients=["b@example.org"]),
            inline_content=b"Subject: urgent\r\n\r\nnow", priority=mail_pb2.PRIORITY_HIGH))
        await asyncio.sleep(0.5)
    await asyncio.wait_for(done.wait(), 60)
    elapsed = time.monotonic() - began
    await outcomes.put(None)
    consumer.cancel()
    await enq_ch.close()
    await deq_ch.close()
    return {"p50": statistics.median(latency), "max": max(latency), "normal_per_s": normal / elapsed,
            "normals_at": (normals_at[0], normals_at[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backlog", type=int, default=10000)
    p.add_argument("--high", type=int, default=20)
    p.add_argument("--prefetch", type=int, default=32)
    a = p.parse_args()
    keyspace = new_keyspace()
    queue = bench_queue("bench-priority")
    procs = start_services(keyspace, ["blob", "enqueue", "dequeue", "browse"])
    try:
        admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}")).CreateQueue(
            admin_pb2.CreateQueueRequest(queue=queue))
        settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
        began = time.monotonic()
        asyncio.run(write_backlog(settings, queue, a.backlog, b"Subject: backlog\r\n\r\n" + b"x" * SIZE, label="normal"))
        print(f"  backlog of {a.backlog} written in {time.monotonic() - began:.0f} s", file=sys.stderr)
        r = asyncio.run(measure(queue, a.high, a.prefetch))
    finally:
        stop(procs)
    print(f"\n{a.high} high-priority mails through a backlog of {a.backlog} normal ones (one consumer, prefetch {a.prefetch})")
    print(f"high: enqueue-to-delivery p50 {r['p50'] * 1000:.0f} ms, max {r['max'] * 1000:.0f} ms; "
          f"normal mails delivered before the first / last high one: {r['normals_at'][0]} / {r['normals_at'][1]}; "
          f"normal throughput meanwhile {r['normal_per_s']:.0f}/s")


if __name__ == "__main__":
    run(main)

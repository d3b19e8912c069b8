"""Delays: lateness under enqueue load, CPU per delayed mail vs an immediate one, idle CPU of a
large delayed backlog.

    .venv/bin/python -m bench.delay_bench [--mails 10000] [--max-delay 60] [--backlog 100000]

1. immediate: ``--mails`` mails enqueued through gRPC (concurrency 16) and dequeued (SUCCESS);
   CPU per mail of every process, enqueue to ack.
2. delayed: the same with a random delay of 0 to ``--max-delay`` seconds each, the consumer running
   while the producers enqueue; CPU per mail, and lateness (delivery time - deliver_at) p50/p99.
3. idle: CPU of every process over ``--idle`` seconds with the queue empty, then again with
   ``--backlog`` mails delayed by an hour (written with the services' own code, in-process, to
   save time: what is measured is the idle cost of holding them).

Everything runs in a RabbitMQ vhost, a keyspace and a bucket of its own, all removed at the end
(the vhost takes the delay ladder's waiting messages with it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import statistics
import sys
import time
import uuid

import grpc

from bench.common import (
    PORTS,
    TAG,
    CpuMeter,
    cpu_seconds,
    new_keyspace,
    own_vhost,
    run,
    stack_pids,
    start_services,
    stop,
    write_backlog,
)
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from services.runtime.settings import Settings

SIZE = 10 * 1024


def content(i: int) -> bytes:
    head = f"Subject: delay bench {i} {uuid.uuid4()}\r\n\r\n".encode()
    return head + b"x" * (SIZE - len(head))


async def enqueue_and_drain(queue: str, mails: int, max_delay: float, pids: dict[str, int]) -> dict:
    """Enqueue ``mails`` (delay uniform in [0, max_delay]) while one consumer drains them."""
    enq_ch = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}")
    deq_ch = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}")
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(enq_ch)
    mail = mail_pb2.Mail(name="bench", sender="a@example.com", recipients=["b@example.org"])
    lateness: list[float] = []
    done = asyncio.Event()
    outcomes: asyncio.Queue = asyncio.Queue()
    await outcomes.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=64)))

    async def requests():
        while True:
            item = await outcomes.get()
            if item is None:
                return
            yield item

    async def consume() -> None:
        call = dequeue_pb2_grpc.DequeueServiceStub(deq_ch).Dequeue(requests())
        async for r in call:
            if r.WhichOneof("kind") != "delivery":
                continue
            d = r.delivery
            due = d.mail.deliver_at if d.mail.HasField("deliver_at") else d.mail.enqueued_at
            lateness.append(time.time() - due.ToNanoseconds() / 1e9)
            await outcomes.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
                delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
            if len(lateness) == mails:
                done.set()

    counter = iter(range(mails))

    async def produce() -> None:
        for i in counter:
            r = enqueue_pb2.EnqueueRequest(queue=queue, mail=mail, inline_content=content(i))
            if max_delay:
                r.delay.FromTimedelta(dt.timedelta(seconds=random.uniform(0, max_delay)))
            await enqueue.Enqueue(r)

    meter = CpuMeter(pids)
    began = time.monotonic()
    consumer = asyncio.create_task(consume())
    await asyncio.gather(*(produce() for _ in range(16)))
    enqueued_in = time.monotonic() - began
    print(f"  enqueued {mails} in {enqueued_in:.1f} s", file=sys.stderr)
    await asyncio.wait_for(done.wait(), max_delay + 300)
    cpu = meter.per_op(mails)
    await outcomes.put(None)
    await consumer
    await enq_ch.close()
    await deq_ch.close()
    lateness.sort()
    return {"cpu": cpu, "enqueued_per_s": mails / enqueued_in, "p50": statistics.median(lateness),
            "p99": lateness[int(len(lateness) * 0.99) - 1], "max": lateness[-1]}


def idle_cpu(pids: dict[str, int], seconds: float) -> str:
    start = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)  # a benchmark measuring idleness: nothing to poll
    used = {name: 100 * (cpu_seconds(pid) - start[name]) / seconds for name, pid in pids.items()}
    return ", ".join(f"{name} {pct:.1f}%" for name, pct in used.items()) + f"; total {sum(used.values()):.1f}% of one core"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mails", type=int, default=10000)
    p.add_argument("--max-delay", type=float, default=60)
    p.add_argument("--backlog", type=int, default=100000)
    p.add_argument("--idle", type=float, default=30, help="seconds of each idle measurement")
    a = p.parse_args()
    with own_vhost():
        keyspace = new_keyspace()
        procs = start_services(keyspace, ["blob", "enqueue", "dequeue", "browse"])
        try:
            pids = {f"{n}_svc": proc.pid for n, proc in zip(["blob", "enqueue", "dequeue", "browse"], procs)}
            admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
            # Not bench_queue(): deleting the vhost removes them (and the ladder with its waiting messages).
            now_q, later_q, backlog_q = (f"bench-{what}-{TAG}" for what in ("now", "later", "backlog"))
            for q in (now_q, later_q, backlog_q):
                admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=q))
            print("[1/3] immediate", file=sys.stderr)
            now = asyncio.run(enqueue_and_drain(now_q, a.mails, 0, pids))
            print("[2/3] delayed", file=sys.stderr)
            later = asyncio.run(enqueue_and_drain(later_q, a.mails, a.max_delay, pids))
            print("[3/3] idle, empty then with the backlog", file=sys.stderr)
            every = {**pids, **stack_pids()}
            empty = idle_cpu(every, a.idle)
            settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
            took = asyncio.run(write_backlog(settings, backlog_q, a.backlog, content(-1), dt.timedelta(hours=1)))
            full = idle_cpu(every, a.idle)
        finally:
            stop(procs)
    print(f"\n{a.mails} mails of {SIZE} B through gRPC (16 producers, 1 consumer at prefetch 64), keyspace {keyspace}")
    print(f"immediate  enqueue {now['enqueued_per_s']:.0f}/s; lateness p50 {now['p50']:.3f} s p99 {now['p99']:.3f} s")
    print(f"           {now['cpu']}")
    print(f"delayed    enqueue {later['enqueued_per_s']:.0f}/s; delays 0-{a.max_delay:.0f} s; lateness p50 {later['p50']:.3f} s "
          f"p99 {later['p99']:.3f} s max {later['max']:.3f} s")
    print(f"           {later['cpu']}")
    print(f"idle {a.idle:.0f} s, queue empty:                  {empty}")
    print(f"idle {a.idle:.0f} s, {a.backlog} mails delayed 1 h:  {full}   (backlog written in {took:.0f} s)")


if __name__ == "__main__":
    run(main)

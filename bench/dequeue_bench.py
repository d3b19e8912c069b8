"""Dequeue + SUCCESS throughput: through gRPC (dequeue_svc), one by one and batched, vs. direct calls.

    .venv/bin/python -m bench.dequeue_bench [--mails 4000] [--prefetch 32] [--batch 32] [--size 10240] [--warmup-mails 500]

Every path does the same work per mail: consume the RabbitMQ message, check the deleted mark in
Cassandra, take the content (carried by a small mail's message; read from Cassandra or MinIO
otherwise), mark the mail deleted, ack. ``grpc`` answers each delivery alone; ``grpc-batch``
subscribes with max_batch and answers each Deliveries message with one Outcomes message. The
direct path runs the same domain code (services/app/dequeuer.py, services/app/subscription.py) in one
process with no gRPC. Mails are enqueued first (not timed); the first --warmup-mails of each
phase are not timed either. Needs the stack up (stack/stack.sh up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import grpc

from bench.common import PORTS, CpuMeter, bench_queue, blob_store, new_keyspace, run, settle, start_services, stop
from bench.enqueue_bench import content
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc
from services.adapters.cassandra.view import View
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.app.dequeuer import Dequeuer
from services.app.enqueuer import Enqueuer, Inline
from services.app.queue_state import QueueState
from services.app.subscription import Outcome
from services.domain import model
from services.runtime.settings import Settings


async def fill(settings: Settings, queue: str, n: int, size: int) -> None:
    view = await View.open(settings.cassandra)
    broker = RabbitMQBroker(settings.rabbitmq)
    blobs = await blob_store(settings, view)
    enqueuer = Enqueuer(view, broker, blobs, settings.limits, QueueState(view))
    mail = model.Mail(name="bench", sender="a@example.com", recipients=("b@example.org",))
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await enqueuer.enqueue(queue, mail, Inline(content(i, size)))

    await asyncio.gather(*(one(i) for i in range(n)))
    await broker.close()
    view.close()


def result(label: str, n: int, seconds: float, cpu: str, **more: Any) -> dict[str, Any]:
    print(f"{label:<10} {n:>7} mails in {seconds:6.2f} s  {n / seconds:>8.1f}/s", file=sys.stderr)
    return {"n": n, "seconds": seconds, "per_s": n / seconds, "cpu": cpu, **more}


async def via_grpc(queue: str, n: int, prefetch: int, warmup: int, services: dict[str, int], batch: int = 1,
                   statements: Any = None) -> dict[str, Any]:
    """One Dequeue stream answering SUCCESS; ``batch`` above 1: deliveries and outcomes batched
    (Subscribe.max_batch, Outcomes), one Outcomes message per Deliveries message. ``statements``:
    a Cassandra request counter to read (common.cassandra_statements); the result also gives the
    mails per Deliveries message (``per_message``)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}")
    stub = dequeue_pb2_grpc.DequeueServiceStub(channel)
    outcomes: asyncio.Queue = asyncio.Queue()
    await outcomes.put(dequeue_pb2.DequeueRequest(
        subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=prefetch, max_batch=batch)))

    async def requests():
        while True:
            yield await outcomes.get()

    call = stub.Dequeue(requests())
    done = messages = 0
    start, meter = time.monotonic(), CpuMeter(services, statements)
    async for response in call:
        kind = response.WhichOneof("kind")
        if kind == "subscribed":
            continue
        deliveries = [response.delivery] if kind == "delivery" else list(response.deliveries.deliveries)
        if done <= warmup < done + len(deliveries):
            start, meter, messages = time.monotonic(), CpuMeter(services, statements), 0
        messages += 1
        for d in deliveries:
            assert d.content_inline and len(d.content) == d.mail.size
        answers = [dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS) for d in deliveries]
        await outcomes.put(dequeue_pb2.DequeueRequest(outcome=answers[0]) if kind == "delivery"
                           else dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(outcomes=answers)))
        done += len(deliveries)
        if done >= warmup + n:
            break
    elapsed = time.monotonic() - start
    timed = done - warmup
    cpu = meter.per_op(timed)
    stmts = meter.statements_per_op(timed)
    call.cancel()
    await channel.close()
    return result("grpc" if batch == 1 else f"grpc-batch{batch}", timed, elapsed, cpu, stmts=stmts,
                  per_message=timed / max(messages, 1))


async def direct(settings: Settings, queue: str, n: int, prefetch: int, warmup: int) -> dict[str, Any]:
    view = await View.open(settings.cassandra)
    broker = RabbitMQBroker(settings.rabbitmq)
    blobs = await blob_store(settings, view)
    dequeuer = Dequeuer(view, broker, blobs, settings.limits, QueueState(view))
    sub = await dequeuer.subscribe(queue, prefetch)
    start, meter = time.monotonic(), CpuMeter({})
    done = 0
    tasks = set()

    async def settle(tag: int) -> None:
        await sub.settle(tag, Outcome.SUCCESS)

    while done < warmup + n:
        d = await sub.next()
        if done == warmup:
            start, meter = time.monotonic(), CpuMeter({})
        assert d.content is not None and len(d.content) == d.mail.size
        t = asyncio.create_task(settle(d.tag))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        done += 1
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    cpu = meter.per_op(n)
    await sub.close()
    await broker.close()
    view.close()
    return result("direct", n, elapsed, cpu)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mails", type=int, default=4000)
    p.add_argument("--prefetch", type=int, default=32)
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--batch", type=int, default=32, help="also measure batched deliveries/outcomes, this many per message (1: skip)")
    p.add_argument("--warmup-mails", type=int, default=500, help="deliveries before timing starts, each phase")
    a = p.parse_args()
    keyspace = new_keyspace()
    settings = Settings.from_env("dequeue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
    grpc_queue, batch_queue, direct_queue = bench_queue("bench-grpc"), bench_queue("bench-batch"), bench_queue("bench-direct")
    queues = (grpc_queue, batch_queue, direct_queue) if a.batch > 1 else (grpc_queue, direct_queue)
    procs = start_services(keyspace, ["blob", "dequeue", "browse"])
    try:
        admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
        for q in queues:
            admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=q))
        print(f"filling {len(queues)} queues with {a.warmup_mails + a.mails} mails of {a.size} B (not timed)", file=sys.stderr)
        for q in queues:
            asyncio.run(fill(settings, q, a.warmup_mails + a.mails, a.size))
        services = {"blob_svc": procs[0].pid, "dequeue_svc": procs[1].pid}
        # Every phase starts on an idle stack: the filling (and the phase before) leave Cassandra compacting.
        settle("grpc")
        g = asyncio.run(via_grpc(grpc_queue, a.mails, a.prefetch, a.warmup_mails, services))
        b = None
        if a.batch > 1:
            settle("grpc-batch")
            b = asyncio.run(via_grpc(batch_queue, a.mails, a.prefetch, a.warmup_mails, services, a.batch))
    finally:
        stop(procs)
    settle("direct")
    d = asyncio.run(direct(settings, direct_queue, a.mails, a.prefetch, a.warmup_mails))
    print(f"\ndequeue + SUCCESS of {a.size} B mails, prefetch {a.prefetch}, one stream, {a.mails} timed after {a.warmup_mails} of warm-up, keyspace {keyspace}")
    print(f"grpc      {g['per_s']:8.1f} mails/s ({g['n']} in {g['seconds']:.2f} s)")
    print(f"          {g['cpu']}")
    if b is not None:
        print(f"batch{a.batch:<4} {b['per_s']:8.1f} mails/s ({b['n']} in {b['seconds']:.2f} s)")
        print(f"          {b['cpu']}")
    print(f"direct    {d['per_s']:8.1f} mails/s ({d['n']} in {d['seconds']:.2f} s)")
    print(f"          {d['cpu']}")
    print(f"ratio grpc/direct throughput: {g['per_s'] / d['per_s']:.2f}")
    if b is not None:
        print(f"ratio grpc-batch/direct throughput: {b['per_s'] / d['per_s']:.2f}")


if __name__ == "__main__":
    run(main)

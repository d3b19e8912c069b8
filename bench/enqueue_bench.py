"""Enqueue throughput: through gRPC (enqueue_svc -> backends) vs. direct backend calls.

    .venv/bin/python -m bench.enqueue_bench [--seconds 30] [--concurrency 32] [--size 10240] [--warmup 5] [--many]
        [--batch N [--pairs K]] [--rate R [--rate-only]] [--floor] [--stream]

``--many`` adds a phase with EnqueueMany: one stream, ``--concurrency`` mails in flight on it.
``--batch N`` adds one with EnqueueBatches: N mails per message, ``--concurrency`` in flight.
``--rate R`` adds a phase of single Enqueues started R per second (latency below the peak).
``--stream`` adds a phase of EnqueueStream calls (a header, then the content in 64 KiB chunks),
``--concurrency`` at once: how a client sends a mail too large for one message.
``--floor`` adds a phase of unary calls that do no work (grpc.health's Check on enqueue_svc, through
the same interceptors), ``--concurrency`` at once: the CPU per call that gRPC and the server
runtime cost before any enqueue work, the floor under the unary Enqueue's.
``--pairs K`` then runs K batched/direct pairs back to back: the backends' own CPU per mail
varies by half from phase to phase (flushes, compactions, quorum-queue segments), so one
ratio of one pair says less than the median of a few.

Both paths do the same writes per mail: content (SHA-256 addressed) to the small-blob table in
Cassandra, or to MinIO above MAILQUEUE_SMALL_BLOB_BYTES, the view row in Cassandra, a persistent
confirmed publish to RabbitMQ that carries small content too. The direct path uses the same adapters
from one Python process, with no gRPC hop. Needs the stack up (stack/stack.sh up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import PORTS, bench_queue, blob_store, load, metric, new_keyspace, report, run, settle, start_services, stop
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from services.adapters.cassandra.view import View
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.app.queues import create_queue
from services.domain import model
from services.domain.slices import bucket_of, slice_start
from services.runtime.settings import Settings

#: enqueue_svc's Prometheus port: calls per group (services/app/enqueue_group.py), per phase.
ENQUEUE_METRICS = 56163


def groups() -> tuple[float, float]:
    """(groups run, calls in them) so far in enqueue_svc."""
    return (metric(ENQUEUE_METRICS, "mailqueue_enqueue_grouped_calls_count"),
            metric(ENQUEUE_METRICS, "mailqueue_enqueue_grouped_calls_sum"))


def grouped(phase: Any) -> Any:
    """Run ``phase`` (a no-argument callable returning its result dict); add its mean calls per group."""
    n0, s0 = groups()
    result = phase()
    n, total = groups()
    result["per_group"] = (total - s0) / max(n - n0, 1)
    return result


def content(i: int, size: int) -> bytes:
    head = f"Subject: bench {i} {uuid.uuid4()}\r\n\r\n".encode()  # distinct content: no dedup shortcut
    return head + b"x" * (size - len(head))


def channel_to(credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """An asyncio channel to the bench's enqueue_svc: over TLS given ``credentials``."""
    target = f"127.0.0.1:{PORTS['enqueue']}"
    return grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)


async def via_grpc(
    queue: str, seconds: float, concurrency: int, size: int, warmup: float, services: dict[str, int], rate: float = 0.0,
    credentials: grpc.ChannelCredentials | None = None, statements: Any = None,
) -> dict[str, Any]:
    """Unary Enqueues from ``concurrency`` callers (``rate``: paced); ``credentials``: over TLS;
    ``statements``: a Cassandra request counter to read (common.load)."""
    channel = channel_to(credentials)
    stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
    mail = mail_pb2.Mail(name="bench", sender="a@example.com", recipients=["b@example.org"])

    async def op(i: int) -> None:
        await stub.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, mail=mail, inline_content=content(i, size)))

    try:
        return await load(op, concurrency, seconds, f"grpc@{rate:.0f}/s" if rate else "grpc", warmup, services, rate, statements)
    finally:
        await channel.close()


async def via_grpc_stream(
    queue: str, seconds: float, concurrency: int, size: int, warmup: float, services: dict[str, int],
    credentials: grpc.ChannelCredentials | None = None, statements: Any = None,
) -> dict[str, Any]:
    channel = channel_to(credentials)
    stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
    mail = mail_pb2.Mail(name="bench", sender="a@example.com", recipients=["b@example.org"])
    chunk = 64 * 1024

    async def op(i: int) -> None:
        body = content(i, size)

        async def requests():  # noqa: ANN202
            yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=mail))
            for at in range(0, len(body), chunk):
                yield enqueue_pb2.EnqueueStreamRequest(chunk=body[at:at + chunk])

        await stub.EnqueueStream(requests())

    try:
        return await load(op, concurrency, seconds, "grpc-stream", warmup, services, statements=statements)
    finally:
        await channel.close()


async def via_grpc_many(
    queue: str, seconds: float, window: int, size: int, warmup: float, services: dict[str, int], batch: int = 1,
    credentials: grpc.ChannelCredentials | None = None, statements: Any = None,
) -> dict[str, Any]:
    """One EnqueueMany stream with ``window`` mails unanswered at most; ``batch`` above 1: one
    EnqueueBatches stream sending ``batch`` mails per message. ``credentials``: over TLS;
    ``statements``: a Cassandra request counter to read (common.load)."""
    import statistics
    import time

    from bench.common import CpuMeter

    channel = channel_to(credentials)
    stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
    mail = mail_pb2.Mail(name="bench", sender="a@example.com", recipients=["b@example.org"])
    credit = asyncio.Semaphore(window)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    began = time.monotonic()
    measure_from, deadline = began + warmup, began + warmup + seconds
    meter: list[CpuMeter] = []
    asyncio.get_running_loop().call_later(warmup, lambda: meter.append(CpuMeter(services, statements)))

    async def requests():
        i = 0
        while time.monotonic() < deadline:
            await credit.acquire()
            i += 1
            sent[i] = time.monotonic()
            yield enqueue_pb2.EnqueueManyRequest(sequence=i, request=enqueue_pb2.EnqueueRequest(
                queue=queue, mail=mail, inline_content=content(i, size)))

    async def batches():
        mails = []
        async for m in requests():
            mails.append(m)
            if len(mails) == batch:
                yield enqueue_pb2.EnqueueBatchesRequest(mails=mails)
                mails = []
        if mails:
            yield enqueue_pb2.EnqueueBatchesRequest(mails=mails)

    async def answers():
        if batch == 1:
            async for r in stub.EnqueueMany(requests()):
                yield r
        else:
            async for results in stub.EnqueueBatches(batches()):
                for r in results.results:
                    yield r

    errors = 0
    async for r in answers():
        credit.release()
        started = sent.pop(r.sequence)
        if r.WhichOneof("result") != "receipt":
            errors += 1
        elif started >= measure_from:
            latencies.append(time.monotonic() - started)
    await channel.close()
    latencies.sort()
    elapsed = time.monotonic() - measure_from
    return {"ops": len(latencies), "per_s": len(latencies) / elapsed, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1], "cpu": meter[0].per_op(len(latencies)),
            "stmts": meter[0].statements_per_op(len(latencies)), "errors": errors}


async def floor(seconds: float, concurrency: int, warmup: float, services: dict[str, int]) -> dict[str, Any]:
    """Unary calls that do no work: grpc.health Check on enqueue_svc."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}")
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest()

    async def op(i: int) -> None:
        await stub.Check(request)

    try:
        return await load(op, concurrency, seconds, "floor", warmup, services)
    finally:
        await channel.close()


async def direct(
    settings: Settings, queue: str, seconds: float, concurrency: int, size: int, warmup: float, statements: Any = None,
) -> dict[str, Any]:
    view = await View.open(settings.cassandra)
    broker = RabbitMQBroker(settings.rabbitmq)
    blobs = await blob_store(settings, view)  # the services' layout: small content in Cassandra
    await create_queue(view, broker, queue)
    mail = model.Mail(name="bench", sender="a@example.com", recipients=("b@example.org",))
    window = (await view.config.current()).slice_window

    async def op(i: int) -> None:
        data = content(i, size)
        info = await blobs.store(data)
        now = model.utcnow()
        eid = uuid.uuid4()
        q = model.QueuedMail(queue, eid, now, mail, (info.blob_id,), info.size, slice_start(now, window),
                             bucket_of(mail.name, str(eid), 1))
        await view.mails.store(q)
        await broker.publish(q, content=settings.limits.carried(data, len(data)))

    try:
        return await load(op, concurrency, seconds, "direct", warmup, statements=statements)
    finally:
        await broker.close()
        view.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--warmup", type=float, default=5, help="seconds of load before measuring, each phase")
    p.add_argument("--many", action="store_true", help="also measure EnqueueMany (one stream)")
    p.add_argument("--batch", type=int, default=0, help="also measure EnqueueBatches with this many mails per message")
    p.add_argument("--rate", type=float, default=0.0, help="also measure single Enqueues paced at this many per second")
    p.add_argument("--rate-only", action="store_true", help="measure the paced phase alone (latency below the peak)")
    p.add_argument("--floor", action="store_true", help="also measure unary calls that do no work (health Check)")
    p.add_argument("--stream", action="store_true", help="also measure EnqueueStream (64 KiB chunks), --concurrency at once")
    p.add_argument("--pairs", type=int, default=0,
                   help="then this many batched/direct pairs back to back, each on new queues: a ratio per pair and their median")
    a = p.parse_args()
    if a.pairs and a.batch <= 1:
        p.error("--pairs needs --batch N (N > 1)")
    keyspace = new_keyspace()
    direct_queue = bench_queue("bench-direct")
    procs = start_services(keyspace, ["blob", "enqueue", "browse"], metrics={"enqueue": ENQUEUE_METRICS})
    try:
        admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
        # A queue per phase: each starts empty, as the direct path's does (a backlog left by the
        # phase before costs the broker more per publish).
        grpc_queue, many_queue, batch_queue = (bench_queue(f"bench-{name}") for name in ("grpc", "many", "batch"))
        for name in (grpc_queue, many_queue, batch_queue):
            admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=name))
        services = {"blob_svc": procs[0].pid, "enqueue_svc": procs[1].pid}
        # The paced phase first: after a saturated one, Cassandra is still compacting what it wrote.
        # And every phase starts on an idle stack (settle), the direct one too.
        paced = None
        if a.rate:
            settle("grpc paced")
            paced = grouped(lambda: asyncio.run(via_grpc(grpc_queue, a.seconds, a.concurrency, a.size, a.warmup, services, a.rate)))
        if a.rate_only:
            print(f"\nenqueue of {a.size} B mails paced at {a.rate:.0f}/s, {a.seconds:.0f} s after {a.warmup:.0f} s of warm-up")
            print(report(f"grpc@{a.rate:.0f}/s", paced) + f"  ({paced['per_group']:.1f} calls per group)")
            print(f"           {paced['cpu']}")
            return
        settle("grpc")
        g = grouped(lambda: asyncio.run(via_grpc(grpc_queue, a.seconds, a.concurrency, a.size, a.warmup, services)))
        m = b = f = st = None
        if a.stream:
            settle("grpc-stream")
            st = grouped(lambda: asyncio.run(via_grpc_stream(grpc_queue, a.seconds, a.concurrency, a.size, a.warmup, services)))
        if a.floor:
            settle("floor")
            f = asyncio.run(floor(a.seconds, a.concurrency, a.warmup, services))
        if a.many:
            settle("grpc-many")
            m = asyncio.run(via_grpc_many(many_queue, a.seconds, a.concurrency, a.size, a.warmup, services))
        if a.batch > 1:
            settle("grpc-batch")
            b = grouped(lambda: asyncio.run(via_grpc_many(batch_queue, a.seconds, a.concurrency, a.size, a.warmup, services, a.batch)))
        pairs = [measure_pair(a, admin, services, keyspace, i) for i in range(a.pairs)]
    finally:
        stop(procs)
    settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
    settle("direct")
    d = asyncio.run(direct(settings, direct_queue, a.seconds, a.concurrency, a.size, a.warmup))
    print(f"\nenqueue of {a.size} B mails, concurrency {a.concurrency}, {a.seconds:.0f} s each after {a.warmup:.0f} s of warm-up, keyspace {keyspace}")
    print(report("grpc", g) + f"  ({g['per_group']:.1f} calls per group)")
    print(f"           {g['cpu']}")
    if st is not None:
        print(report("grpc-stream", st) + f"  ({st['per_group']:.1f} calls per group)")
        print(f"           {st['cpu']}")
    if f is not None:
        print(report("floor", f) + "  (grpc.health Check: no enqueue work)")
        print(f"           {f['cpu']}")
    if m is not None:
        print(report("grpc-many", m) + f"  ({m['errors']} refused)")
        print(f"           {m['cpu']}")
    if b is not None:
        print(report(f"grpc-batch{a.batch}", b) + f"  ({b['errors']} refused; {b['per_group']:.1f} mails per group)")
        print(f"           {b['cpu']}")
    if paced is not None:
        print(report(f"grpc@{a.rate:.0f}/s", paced) + f"  ({paced['per_group']:.1f} calls per group)")
        print(f"           {paced['cpu']}")
    print(report("direct", d))
    print(f"           {d['cpu']}")
    print(f"ratio grpc/direct throughput: {g['per_s'] / d['per_s']:.2f}")
    if st is not None:
        print(f"ratio grpc-stream/direct throughput: {st['per_s'] / d['per_s']:.2f}")
    if b is not None:
        print(f"ratio grpc-batch/direct throughput: {b['per_s'] / d['per_s']:.2f}")
    if pairs:
        print(f"\n{len(pairs)} pairs, batched then direct, each on new queues after settle:")
        for i, (pb, pd) in enumerate(pairs, 1):
            print(f"pair {i}: {report(f'grpc-batch{a.batch}', pb)}\n           {pb['cpu']}")
            print(f"        {report('direct', pd)}\n           {pd['cpu']}")
            print(f"        ratio {pb['per_s'] / pd['per_s']:.2f}")
        ratios = sorted(pb["per_s"] / pd["per_s"] for pb, pd in pairs)
        print(f"ratio grpc-batch/direct, median of {len(pairs)} pairs: {statistics.median(ratios):.2f} "
              f"(each: {', '.join(f'{r:.2f}' for r in ratios)})")


def measure_pair(a: argparse.Namespace, admin: Any, services: dict[str, int], keyspace: str, i: int) -> tuple[dict, dict]:
    """One batched phase and one direct phase, back to back, each on a queue of its own."""
    batch_queue, direct_queue = bench_queue(f"bench-batch{i}"), bench_queue(f"bench-direct{i}")
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=batch_queue))
    settle(f"pair {i + 1} grpc-batch")
    b = asyncio.run(via_grpc_many(batch_queue, a.seconds, a.concurrency, a.size, a.warmup, services, a.batch))
    settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
    settle(f"pair {i + 1} direct")
    return b, asyncio.run(direct(settings, direct_queue, a.seconds, a.concurrency, a.size, a.warmup))


if __name__ == "__main__":
    run(main)

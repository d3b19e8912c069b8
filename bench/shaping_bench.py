"""Traffic shaping: CPU per delivered mail with shaping off and on, wait accuracy, idle cost of a
large backlog waiting for a throttled destination.

    .venv/bin/python -m bench.shaping_bench [--mails 5000] [--rate 100] [--paced 1500] [--backlog 100000] [--idle 30]

One dequeue_svc (with enqueue, blob and browse), one consumer stream per queue answering SUCCESS
(prefetch 64, max_batch 64). Mails of 10 KiB to b@example.org are written first as Enqueue writes
them (in-process, not timed); each drain is timed from its subscription to its last delivery.

1. off: no throttle exists at all (the shaper's admit is one attribute read).
2. on, not binding: example.org throttled for the queue at 1,000,000/s and concurrency 100,000:
   every mail is admitted and released through the shaper's bookkeeping, none waits.
3. on, binding: example.org at ``--rate``/s for ``--paced`` mails: each mail but the first
   reserves a slot and waits for it once in the delay ladder (a publish and an ack more).
   Wait accuracy: the k-th delivery's distance from the grid (first delivery + k / rate), as the
   client sees it, and the service's own mailqueue_shaping_slot_lateness_seconds histogram.
4. idle: CPU of every process over ``--idle`` seconds with a consumer subscribed to an empty
   queue, then with ``--backlog`` mails waiting for example.org throttled at 1/m (first sorted
   into their waits by the same consumer: that pass is timed too).

A consumer stays subscribed to a keep-alive queue from the start, so the dequeue process is a
member that shares the limits before the first throttle exists. Everything runs in a RabbitMQ
vhost, a keyspace and a bucket of its own, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import grpc

from bench.common import PORTS, TAG, CpuMeter, metric, new_keyspace, own_vhost, run, stack_pids, start_services, stop, write_backlog
from bench.delay_bench import content, idle_cpu
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc, shaping_pb2
from services.runtime.settings import Settings

DEQUEUE_METRICS = 56152
DESTINATION = "example.org"


class Consumer:
    """One Dequeue stream answering SUCCESS; records when each delivery arrived."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.arrivals: list[float] = []
        self._answers: asyncio.Queue = asyncio.Queue()
        self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}")
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._answers.put(dequeue_pb2.DequeueRequest(
            subscribe=dequeue_pb2.Subscribe(queue=self.queue, prefetch=64, max_batch=64)))
        self._task = asyncio.create_task(self._run())

    async def _requests(self):
        while (item := await self._answers.get()) is not None:
            yield item

    async def _run(self) -> None:
        call = dequeue_pb2_grpc.DequeueServiceStub(self._channel).Dequeue(self._requests())
        async for r in call:
            kind = r.WhichOneof("kind")
            if kind not in ("delivery", "deliveries"):
                continue
            batch = [r.delivery] if kind == "delivery" else list(r.deliveries.deliveries)
            now = time.monotonic()
            self.arrivals.extend(now for _ in batch)
            await self._answers.put(dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(outcomes=[
                dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS) for d in batch])))

    async def until(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.arrivals) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.queue}: {len(self.arrivals)} of {n} deliveries after {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self._answers.put(None)
        if self._task:
            self._task.cancel()
        await self._channel.close()


async def set_throttle(admin, queue: str, rate: int | None = None, per: int = shaping_pb2.RATE_PERIOD_SECOND,
                       concurrency: int = 0) -> None:
    t = shaping_pb2.Throttle(destination=DESTINATION, queue=queue, concurrency=concurrency)
    if rate:
        t.rate.CopyFrom(shaping_pb2.Rate(count=rate, per=per))
    await admin.SetThrottle(admin_pb2.SetThrottleRequest(throttle=t))
    await asyncio.sleep(2.5)  # a benchmark: the bound for a limit to reach every replica is 2 s


async def drain(settings: Settings, queue: str, n: int, pids: dict[str, int], label: str) -> dict:
    took = await write_backlog(settings, queue, n, content(-1), label=label)
    print(f"  [{label}] {n} mails written in {took:.0f} s; draining", file=sys.stderr)
    consumer = Consumer(queue)
    meter, began = CpuMeter(pids), time.monotonic()
    await consumer.start()
    await consumer.until(n, 600)
    seconds = time.monotonic() - began
    cpu = meter.per_op(n)
    await consumer.close()
    return {"per_s": n / seconds, "cpu": cpu, "arrivals": consumer.arrivals}


def accuracy(arrivals: list[float], rate: float) -> str:
    first = arrivals[0]
    off = sorted(abs(t - (first + k / rate)) for k, t in enumerate(arrivals))
    span = arrivals[-1] - first
    return (f"{len(arrivals) - 1} deliveries in {span:.2f} s = {(len(arrivals) - 1) / span:.1f}/s; distance from the grid "
            f"p50 {1000 * statistics.median(off):.0f} ms, p99 {1000 * off[int(len(off) * 0.99) - 1]:.0f} ms, max {1000 * off[-1]:.0f} ms")


def histogram() -> str:
    name = "mailqueue_shaping_slot_lateness_seconds"
    count = metric(DEQUEUE_METRICS, f"{name}_count", destination=DESTINATION)
    total = metric(DEQUEUE_METRICS, f"{name}_sum", destination=DESTINATION)
    within = {le: metric(DEQUEUE_METRICS, f"{name}_bucket", destination=DESTINATION, le=le) for le in ("0.05", "0.1", "0.25")}
    shares = ", ".join(f"≤ {float(le) * 1000:.0f} ms {100 * v / count:.1f}%" for le, v in within.items())
    return f"{count:.0f} handed out at their slot: mean {1000 * total / count:.0f} ms after it; {shares}"


async def amain(a: argparse.Namespace, keyspace: str) -> list[str]:
    procs = start_services(keyspace, ["blob", "enqueue", "dequeue", "browse"], metrics={"dequeue": DEQUEUE_METRICS})
    lines = []
    keep = None
    idle = None
    try:
        pids = {f"{n}_svc": proc.pid for n, proc in zip(["blob", "enqueue", "dequeue", "browse"], procs)}
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['browse']}")
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        queues = {what: f"shape-{what}-{TAG}" for what in ("keep", "off", "free", "paced", "idle")}
        for q in queues.values():
            await admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=q))
        settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})
        keep = Consumer(queues["keep"])
        await keep.start()

        print("[1/4] shaping off", file=sys.stderr)
        off = await drain(settings, queues["off"], a.mails, pids, "off")
        print("[2/4] shaping on, not binding", file=sys.stderr)
        await set_throttle(admin, queues["free"], rate=1_000_000, concurrency=100_000)
        free = await drain(settings, queues["free"], a.mails, pids, "free")
        print("[3/4] shaping on, binding", file=sys.stderr)
        await set_throttle(admin, queues["paced"], rate=a.rate)
        paced = await drain(settings, queues["paced"], a.paced, pids, "paced")
        joining = metric(DEQUEUE_METRICS, "mailqueue_shaping_waits_total", reason="joining")

        print("[4/4] idle, empty then with the backlog waiting", file=sys.stderr)
        await set_throttle(admin, queues["idle"], rate=1, per=shaping_pb2.RATE_PERIOD_MINUTE)
        idle = Consumer(queues["idle"])
        await idle.start()
        every = {**pids, **stack_pids()}
        empty = await asyncio.to_thread(idle_cpu, every, a.idle)
        rate_waits = metric(DEQUEUE_METRICS, "mailqueue_shaping_waits_total", reason="rate")
        began = time.monotonic()
        meter = CpuMeter(pids)
        took = await write_backlog(settings, queues["idle"], a.backlog, content(-1), label="idle")
        deadline = time.monotonic() + 1800
        while metric(DEQUEUE_METRICS, "mailqueue_shaping_waits_total", reason="rate") - rate_waits < a.backlog - 1:
            if time.monotonic() > deadline:
                raise SystemExit("the backlog was not sorted into its waits within 30 min")
            await asyncio.sleep(1)
        sorted_in = time.monotonic() - began
        sort_cpu = meter.per_op(a.backlog)
        full = await asyncio.to_thread(idle_cpu, every, a.idle)
        waiting = metric(DEQUEUE_METRICS, "mailqueue_shaping_waiting", destination=DESTINATION)

        lines += [
            f"\n{a.mails} mails of 10 KiB per drain, one dequeue_svc, one consumer (prefetch 64, max_batch 64), keyspace {keyspace}",
            f"off            {off['per_s']:7.0f}/s  {off['cpu']}",
            f"on, free       {free['per_s']:7.0f}/s  {free['cpu']}",
            f"on, {a.rate}/s    {paced['per_s']:7.0f}/s  {paced['cpu']}  ({a.paced} mails, each but the first waits once)",
            f"wait accuracy  {accuracy(paced['arrivals'], a.rate)}",
            f"               service: {histogram()}",
            f"               mails sent to wait for joining: {joining:.0f}",
            f"backlog        {a.backlog} written in {took:.0f} s and sorted into their waits {sorted_in:.0f} s after the first; "
            f"{sort_cpu}",
            f"idle {a.idle:.0f} s, consumer on an empty queue:                   {empty}",
            f"idle {a.idle:.0f} s, {a.backlog} mails waiting for {DESTINATION} at 1/m: {full}  (waiting gauge {waiting:.0f})",
        ]
    finally:
        for c in (keep, idle):
            if c:
                await c.close()
        stop(procs)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mails", type=int, default=5000)
    p.add_argument("--rate", type=int, default=100, help="the binding phase's limit, per second")
    p.add_argument("--paced", type=int, default=1500)
    p.add_argument("--backlog", type=int, default=100000)
    p.add_argument("--idle", type=float, default=30, help="seconds of each idle measurement")
    a = p.parse_args()
    with own_vhost():
        keyspace = new_keyspace()
        lines = asyncio.run(amain(a, keyspace))
    print("\n".join(lines))


if __name__ == "__main__":
    run(main)

"""A deep queue (#39): fill one queue to each depth in turn, look at it there, heal it, then drain it.

    .venv/bin/python -m bench.depth_bench [--depths 10000,100000,300000] [--size 10240] [--batch 32]
        [--concurrency 128] [--heal-rows 20000]

Everything through gRPC, as a client and an operator would, on a keyspace of its own:

- **fill**: EnqueueBatches of ``--batch`` with ``--concurrency`` mails in flight (a new stream every
  50,000 mails), no consumer,
  from one depth to the next; each segment's rate, and CPU ms per mail of every process;
- **look**, at each depth: GetSize (counters), GetQueue, the first Browse page of 100 (no
  filter), a Browse by name and one by enqueue id of a mail enqueued at the start of the segment,
  GetSize exact;
  each timed, with the rows browse_svc read for it (mailqueue_view_rows_read_total);
- **heal**, at each depth: a browse_svc that heals every second (``--heal-rows`` rows a round)
  is started, three of its rounds measured (seconds and rows read per round), then stopped;
- **drain**: Dequeue streams (max_batch 64, prefetch 256) of 25,000 deliveries each, to empty;
  the rate of each tenth.

RSS (MB) of every process is printed after each step. Needs the stack up (stack/stack.sh up).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import grpc

from bench.common import PORTS, CpuMeter, bench_queue, env, metric, new_keyspace, run, settle, stack_pids, start_services, stop
from bench.enqueue_bench import content
from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from stack.harness import ServiceProcess

METRICS = {"browse": 56161, "enqueue": 56162}


def rss_mb(pids: dict[str, int]) -> str:
    out = []
    for name, pid in pids.items():
        try:
            with open(f"/proc/{pid}/status") as f:
                kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
            out.append(f"{name} {kb // 1024}")
        except (OSError, StopIteration):
            pass
    return "RSS MB: " + ", ".join(out)


#: Mails per EnqueueBatches stream: a stream lasts about 25 s, inside the 30 s a server gives a
#: stream to finish once its connection reached MAILQUEUE_MAX_CONNECTION_AGE_S (5 min), the way a
#: long-lived client cuts its streams.
STREAM_MAILS = 50_000


async def fill(queue: str, n: int, size: int, batch: int, window: int, services: dict[str, int]) -> tuple[float, str]:
    """``n`` mails by EnqueueBatches, ``window`` unanswered at most; (mails/s, CPU per mail)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}")
    stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
    mail = mail_pb2.Mail(name="bench", sender="a@example.com", recipients=["b@example.org"])
    credit = asyncio.Semaphore(window)
    body = content(0, size)

    async def batches(first: int, last: int):  # noqa: ANN202
        i = first
        while i < last:
            mails = []
            for _ in range(min(batch, last - i)):
                await credit.acquire()
                mails.append(enqueue_pb2.EnqueueManyRequest(sequence=i, request=enqueue_pb2.EnqueueRequest(
                    queue=queue, mail=mail, inline_content=body)))
                i += 1
            yield enqueue_pb2.EnqueueBatchesRequest(mails=mails)

    meter, began, done, refused = CpuMeter(services), time.monotonic(), 0, 0
    for first in range(0, n, STREAM_MAILS):
        async for answer in stub.EnqueueBatches(batches(first, min(first + STREAM_MAILS, n))):
            for r in answer.results:
                credit.release()
                done += 1
                refused += r.WhichOneof("result") != "receipt"
                if done % 20000 == 0:
                    print(f"  [fill] {done}/{n} at {done / (time.monotonic() - began):.0f}/s", file=sys.stderr)
    elapsed = time.monotonic() - began
    await channel.close()
    if refused:
        raise SystemExit(f"{refused} enqueues refused: see the services' logs")
    return n / elapsed, meter.per_op(n)


def timed(label: str, call: Any, op: str) -> tuple[str, float, float, Any]:
    rows0 = metric(METRICS["browse"], "mailqueue_view_rows_read_total", op=op)
    began = time.monotonic()
    result = call()
    seconds = time.monotonic() - began
    return label, seconds, metric(METRICS["browse"], "mailqueue_view_rows_read_total", op=op) - rows0, result


def look(browse: Any, queue: str, needle: str, needle_id: str) -> list[tuple[str, float, float, Any]]:
    return [
        timed("GetSize (counters)", lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size, "size"),
        timed("GetQueue", lambda: browse.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info.size, "size"),
        timed("Browse, first page of 100", lambda: len(list(browse.Browse(browse_pb2.BrowseRequest(queue=queue, limit=100)))),
              "browse"),
        timed("Browse by name (one mail)", lambda: len(list(browse.Browse(browse_pb2.BrowseRequest(queue=queue, name=needle)))),
              "browse"),
        timed("Browse by enqueue id", lambda: len(list(browse.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=needle_id)))),
              "browse"),
        timed("GetSize exact", lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True), timeout=600).size,
              "size"),
    ]


def heal(keyspace: str, rows: int) -> tuple[float, float]:
    """Seconds and rows read per healer round, over three rounds of a browse_svc of its own."""
    healer = ServiceProcess("browse", env(keyspace, "browse", 0, {
        "MAILQUEUE_PORT": "0", "MAILQUEUE_HEAL_INTERVAL_S": "1", "MAILQUEUE_HEAL_ROWS_PER_ROUND": str(rows)}), metrics=True)
    try:
        count = lambda: healer.metric("mailqueue_healer_round_seconds_count")  # noqa: E731
        deadline = time.monotonic() + 900
        while count() < 1:  # the first round: a lease to take, a pass to begin
            if time.monotonic() > deadline:
                raise SystemExit("no healer round in 900 s")
            time.sleep(0.5)
        n0, s0 = count(), healer.metric("mailqueue_healer_round_seconds_sum")
        r0 = healer.metric("mailqueue_view_rows_read_total", op="heal")
        while count() < n0 + 3:
            if time.monotonic() > deadline:
                raise SystemExit("the healer made no three rounds in 900 s")
            time.sleep(0.5)
        n = count() - n0
        return ((healer.metric("mailqueue_healer_round_seconds_sum") - s0) / n,
                (healer.metric("mailqueue_view_rows_read_total", op="heal") - r0) / n)
    finally:
        healer.stop()


async def drain(queue: str, n: int, services: dict[str, int]) -> tuple[list[float], str]:
    """Dequeue ``n`` mails answering SUCCESS, on streams of ``STREAM_MAILS`` deliveries at most
    (each half-closed then, as a long-lived consumer does); the rate of each tenth and CPU per mail."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}")
    stub = dequeue_pb2_grpc.DequeueServiceStub(channel)
    meter, began, done, rates = CpuMeter(services), time.monotonic(), 0, []
    tenth, mark = max(n // 10, 1), time.monotonic()
    while done < n:
        outcomes: asyncio.Queue = asyncio.Queue()
        await outcomes.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=256, max_batch=64)))

        async def requests(outcomes: asyncio.Queue = outcomes):  # noqa: ANN202
            while (request := await outcomes.get()) is not None:
                yield request

        in_stream, closing = 0, False
        async for response in stub.Dequeue(requests()):
            if response.WhichOneof("kind") != "deliveries" or closing:
                continue  # after the half-close: left unanswered, they go back to the queue
            ds = list(response.deliveries.deliveries)
            await outcomes.put(dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(outcomes=[
                dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS) for d in ds])))
            before, done, in_stream = done, done + len(ds), in_stream + len(ds)
            if done // tenth > before // tenth:
                now = time.monotonic()
                rates.append(tenth / (now - mark))
                mark = now
                print(f"  [drain] {done}/{n} at {rates[-1]:.0f}/s", file=sys.stderr)
            if done >= n or in_stream >= STREAM_MAILS // 2:
                closing = True
                await outcomes.put(None)  # half-close: the server settles what was answered, then ends
    cpu = meter.per_op(done)
    print(f"drained {done} in {time.monotonic() - began:.0f} s", file=sys.stderr)
    await channel.close()
    return rates, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", default="10000,100000,300000")
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--heal-rows", type=int, default=20_000)
    a = p.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    keyspace = new_keyspace()
    # The healer off in these: the measuring browse_svc (``heal``) must get the healer's lease,
    # which a round of this one would hold for three of its intervals (15 min).
    procs = start_services(keyspace, ["enqueue", "browse", "dequeue"], metrics=METRICS, extra={"MAILQUEUE_HEAL_INTERVAL_S": "0"})
    try:
        services = {"enqueue_svc": procs[0].pid, "browse_svc": procs[1].pid, "dequeue_svc": procs[2].pid}
        every = {**services, **stack_pids()}
        queue = bench_queue("bench-depth")
        admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}")).CreateQueue(
            admin_pb2.CreateQueueRequest(queue=queue))
        enqueue = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}"))
        browse = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
        depth, report = 0, []
        for target in depths:
            needle = f"needle-{target}"
            needle_id = enqueue.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, inline_content=content(1, a.size), mail=mail_pb2.Mail(
                name=needle, sender="a@example.com", recipients=["b@example.org"]))).receipt.enqueue_id
            rate, cpu = asyncio.run(fill(queue, target - depth - 1, a.size, a.batch, a.concurrency, services))
            depth = target
            report.append(f"fill to {target}: {rate:.0f}/s; {cpu}")
            print(report[-1], file=sys.stderr)
            settle(f"depth {target}")
            for label, seconds, rows, result in look(browse, queue, needle, needle_id):
                report.append(f"  at {target}: {label:<28} {seconds:8.3f} s  rows read {rows:>9.0f}  answer {result}")
            per_round, rows = heal(keyspace, a.heal_rows)
            report.append(f"  at {target}: healer round ({a.heal_rows} rows max)  {per_round:8.3f} s  rows read {rows:>9.0f}")
            report.append(f"  at {target}: {rss_mb(every)}")
            print("\n".join(report[-8:]), file=sys.stderr)
        rates, cpu = asyncio.run(drain(queue, depth, services))
        report.append(f"drain of {depth}: per tenth {', '.join(f'{r:.0f}' for r in rates)} /s; {cpu}")
        report.append(rss_mb(every))
        print("\n" + "\n".join(report))
    finally:
        stop(procs)


if __name__ == "__main__":
    run(main)

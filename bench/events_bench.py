"""What events cost: the batched enqueue and dequeue rates with the mail history on and off, in one run.

    .venv/bin/python -m bench.events_bench [--rounds 2] [--warm-rounds 1] [--seconds 10] [--warmup 3] [--concurrency 128]
        [--batch 32] [--prefetch 128] [--size 10240] [--settle 60] [--modes off,true]

``--modes off,true,history,stream,unwritten`` tells the parts apart: the history without the stream,
the stream without the history, and events made and encoded but written nowhere (MAILQUEUE_EVENTS values for measuring only). The
summary then compares each mode with the first, and prints each process's mean CPU per mail by mode.

The measured rounds run on a keyspace warmed by ``--warm-rounds`` rounds left out of the figures
(a new keyspace's first phase meets its first flushes and compactions: 1.55 ms of Cassandra CPU
per mail enqueued against 0.5-0.9 after it), and each measured phase starts with the mail tables
emptied (TRUNCATE: bench/common.py ``empty_tables``; ``--keep-tables`` lets them grow over the
run). Each round runs the modes back to back (off then on, on then off in the next round: a later
phase meets the earlier one's flushes and compactions; services started with MAILQUEUE_EVENTS=off
or true, on one keyspace): an EnqueueBatches phase (``--batch`` mails per message,
``--concurrency`` in flight) for ``--seconds``, then a batched Dequeue (max_batch ``--batch``,
SUCCESS for each) of the mails just enqueued. With events on, each enqueue records ENQUEUED and
each delivery HANDED_OUT and DELIVERED (services/adapters/cassandra/event_log.py). The CPU per
mail of each process is printed per phase, with the Cassandra requests per mail by kind; the
ratio on/off per round (rates, and all processes' CPU per mail off/on), and their medians. Needs
the stack up (stack/stack.sh up) and the bench ports free.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import statistics
import sys
from typing import Any

import grpc

from bench.common import (
    PORTS,
    bench_queue,
    cassandra_statements,
    empty_tables,
    metric,
    new_keyspace,
    report,
    run,
    settle,
    start_services,
    statements_line,
    stop,
)
from bench.dequeue_bench import via_grpc as dequeue_batched
from bench.enqueue_bench import via_grpc_many
from mailqueue.v1 import admin_pb2, admin_pb2_grpc

MODES = ("off", "true")
#: Prometheus ports of the bench's services: their Cassandra requests per mail, by kind.
METRICS = {"enqueue": 56061, "dequeue": 56062}


def gc_seconds(service: str) -> float:
    """The collector's time so far in the bench's ``service`` (services/runtime/heap.py)."""
    return metric(METRICS[service], "mailqueue_gc_pause_seconds_total")


def phase(a: argparse.Namespace, keyspace: str, mode: str, i: int,
          extra: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One mode: services started with MAILQUEUE_EVENTS=mode (and ``extra``), enqueue then dequeue
    on a new queue. Each result's ``gc_ms``: the collector's ms per mail in the phase's service.
    Unless ``--keep-tables``, the mail tables are emptied first (``empty_tables``)."""
    if not a.keep_tables and i >= 0:
        empty_tables(keyspace, f"round {i + 1} events={mode}")
    procs = start_services(keyspace, ["enqueue", "dequeue", "browse"], metrics=METRICS,
                           extra={"MAILQUEUE_EVENTS": mode, **(extra or {})})
    try:
        queue = bench_queue(f"bench-events-{mode}{i}")
        admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
        admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
        services = {"enqueue_svc": procs[0].pid, "dequeue_svc": procs[1].pid, "browse_svc": procs[2].pid}
        settle(f"round {i + 1} events={mode} enqueue", a.settle)
        gc_before = gc_seconds("enqueue")
        e = asyncio.run(via_grpc_many(queue, a.seconds, a.concurrency, a.size, a.warmup, services, a.batch,
                                      statements=functools.partial(cassandra_statements, METRICS["enqueue"])))
        e["gc_ms"] = (gc_seconds("enqueue") - gc_before) * 1000 / max(e["ops"], 1)  # the warm-up's mails included
        settle(f"round {i + 1} events={mode} dequeue", a.settle)
        gc_before = gc_seconds("dequeue")
        warmup = min(500, e["ops"] // 5)
        d = asyncio.run(dequeue_batched(queue, int(e["ops"]) - warmup, a.prefetch, warmup, services, a.batch,
                                        functools.partial(cassandra_statements, METRICS["dequeue"])))
        d["gc_ms"] = (gc_seconds("dequeue") - gc_before) * 1000 / max(d["n"] + warmup, 1)
        # The event stream's messages from dequeue_svc (started for this mode: its counts are the
        # phase's), per mail it handed out; and the events each held.
        published = {u: metric(METRICS["dequeue"], "mailqueue_event_stream_published_total", unit=u) for u in ("messages", "events")}
        d["stream"] = (published["messages"] / max(d["n"] + warmup, 1), published["events"] / max(published["messages"], 1))
        return e, d
    finally:
        stop(procs)


#: The processes a CPU-per-op line names, in the order of the summary.
PROCESSES = ("enqueue_svc", "dequeue_svc", "browse_svc", "cassandra", "rabbitmq", "total")


def cpu_of(line: str, process: str) -> float:
    """One process's ms per mail in a CPU-per-op line (0 when it is not named)."""
    m = re.search(rf"(?:[:,] |; ){process} ([0-9.]+)", line)
    return float(m.group(1)) if m else 0.0


def total_cpu(line: str) -> float:
    """The total of a CPU-per-op line (common.CpuMeter.per_op): every process's ms per mail."""
    return max(float(re.search(r"; total ([0-9.]+)", line).group(1)), 1e-9)  # type: ignore[union-attr]


def phase_arguments(p: argparse.ArgumentParser, seconds: float) -> None:
    """The options ``phase`` reads, and the rounds (bench/gc_bench.py runs the same phases)."""
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=seconds)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prefetch", type=int, default=128)
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--settle", type=float, default=60, help="seconds at most to wait for an idle stack before a phase")
    p.add_argument("--keep-tables", action="store_true",
                   help="do not empty the mail tables before each measured phase (they then grow over the run)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    phase_arguments(p, seconds=10)
    p.add_argument("--warm-rounds", type=int, default=1, help="rounds run first and left out of the figures (a warmed keyspace)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="MAILQUEUE_EVENTS values, the first the base the others are compared with: off, true, "
                        "and, to tell the parts apart, history (no stream), stream (no history) and unwritten (events made, not written)")
    a = p.parse_args()
    modes = a.modes.split(",")
    keyspace = new_keyspace()
    for i in range(a.warm_rounds):  # the new keyspace's first writes (flushes, compactions) in no figure
        for mode in modes:
            phase(a, keyspace, mode, -1 - i)
    results: list[dict[str, tuple[dict[str, Any], dict[str, Any]]]] = []
    for i in range(a.rounds):
        order = modes if i % 2 == 0 else modes[::-1]  # alternate which mode runs first (warm-up, compactions)
        results.append({mode: phase(a, keyspace, mode, i) for mode in order})
    print(f"\nevents off / on, {a.size} B mails, EnqueueBatches {a.batch} x {a.concurrency} in flight for {a.seconds:.0f} s, "
          f"then Dequeue max_batch {a.batch} prefetch {a.prefetch}; keyspace {keyspace}")
    base = modes[0]
    for i, r in enumerate(results, 1):
        for mode in r:
            e, d = r[mode]
            print(f"round {i} events={mode}: {report('enqueue', e)}\n           {e['cpu']}\n           {statements_line(e['stmts'])}")
            print(f"           dequeue {d['per_s']:.1f}/s ({d['n']} mails, {d['per_message']:.1f} per Deliveries message; "
                  f"{d['stream'][0]:.3f} event-stream messages per mail, {d['stream'][1]:.0f} events each)"
                  f"\n           {d['cpu']}\n           {statements_line(d['stmts'])}")
    for mode in modes[1:]:
        ratios: dict[str, list[float]] = {"enqueue": [], "dequeue": [], "enqueue CPU": [], "dequeue CPU": []}
        for r in results:
            for k, path in (("enqueue", 0), ("dequeue", 1)):
                ratios[k].append(r[mode][path]["per_s"] / r[base][path]["per_s"])
                # The same comparison by CPU: all processes' CPU per mail base / mode (a rate is
                # also moved by what else the machine does in that window; CPU per mail much less so).
                ratios[f"{k} CPU"].append(total_cpu(r[base][path]["cpu"]) / total_cpu(r[mode][path]["cpu"]))
        for label, (e, d) in ((f"ratio {mode}/{base}", ("enqueue", "dequeue")), (f"CPU per mail {base}/{mode}", ("enqueue CPU", "dequeue CPU"))):
            print(f"{label}, median of {len(results)} rounds: enqueue {statistics.median(ratios[e]):.2f} "
                  f"(each {', '.join(f'{x:.2f}' for x in ratios[e])}), dequeue {statistics.median(ratios[d]):.2f} "
                  f"(each {', '.join(f'{x:.2f}' for x in ratios[d])})")
    for path, k in (("enqueue", 0), ("dequeue", 1)):
        print(f"{path}: mean CPU ms per mail over the rounds, by process and mode")
        for process in PROCESSES:
            means = {m: statistics.mean(cpu_of(r[m][k]["cpu"], process) for r in results) for m in modes}
            print(f"  {process:12s} " + "  ".join(f"{m} {v:.2f}" for m, v in means.items())
                  + "".join(f"  ({m} {means[m] - means[base]:+.2f})" for m in modes[1:]))
    sys.stdout.flush()


if __name__ == "__main__":
    run(main)

"""One enqueue_svc process against several on its port (MAILQUEUE_WORKERS), where the process is the
limit: ghz calling grpc.health.v1.Health/Check over TLS (the gRPC floor: no backend work, so
neither Cassandra nor RabbitMQ shares the cores) and, with ``--enqueue``, Enqueue of 10 KiB mail.

    make ghz          # once: ghz (bench/ghz.py)
    .venv/bin/python -m bench.workers_bench [--workers 1,2] [--rounds 3] [--seconds 10] [--concurrency 64]
        [--connections 16] [--enqueue]

Each round starts enqueue_svc with each worker count in turn (reversed in even rounds), warms it
for 3 s, then measures: calls/s, p50, p99, and CPU ms per call of enqueue_svc (the supervisor and
its workers) and of ghz. The summary gives each count's median rate and its ratio to the first.
The kernel spreads connections, not calls, over the workers: give ghz several (``--connections``).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import grpc

from bench import ghz
from bench.common import PORTS, bench_queue, drop_queues, new_keyspace, report, run, settle, start_services, stop
from mailqueue.v1 import admin_pb2, admin_pb2_grpc
from stack.harness import ROOT

PKI = os.path.join(ROOT, ".stack", "pki")
HEALTH = "grpc.health.v1.Health.Check"


def measure(a: argparse.Namespace, keyspace: str, workers: int, call: str, label: str) -> dict[str, Any]:
    ca = os.path.join(PKI, "ca.crt")
    with open(ca, "rb") as f:
        credentials = grpc.ssl_channel_credentials(f.read())
    tls = {"MAILQUEUE_TLS_CERT_FILE": os.path.join(PKI, "services.crt"), "MAILQUEUE_TLS_KEY_FILE": os.path.join(PKI, "services.key")}
    procs = start_services(keyspace, ["enqueue"], extra={**tls, "MAILQUEUE_WORKERS": str(workers)}, credentials=credentials)
    queue = bench_queue(f"bench-workers{workers}")
    try:
        if call == ghz.CALL:
            procs += start_services(keyspace, ["browse"], extra=tls, credentials=credentials)
            admin_pb2_grpc.AdminServiceStub(grpc.secure_channel(f"127.0.0.1:{PORTS['browse']}", credentials)).CreateQueue(
                admin_pb2.CreateQueueRequest(queue=queue), timeout=30)
        settle(label, a.settle_s)
        ghz.run_ghz(queue, 3, a.concurrency, a.connections, a.size, ca, call=call)  # warm-up, unmeasured
        return ghz.run_ghz(queue, a.seconds, a.concurrency, a.connections, a.size, ca, {"enqueue_svc": procs[0].pid}, call=call)
    finally:
        stop(procs)
        if call == ghz.CALL:
            drop_queues([queue])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--settle-s", type=float, default=60)
    p.add_argument("--enqueue", action="store_true", help="Enqueue instead of the health check")
    a = p.parse_args()
    counts = [int(w) for w in a.workers.split(",")]
    call = ghz.CALL if a.enqueue else HEALTH
    ghz.binary()
    keyspace = new_keyspace()
    results: dict[tuple[int, int], dict[str, Any]] = {}
    for rnd in range(a.rounds):
        for w in (counts if rnd % 2 == 0 else counts[::-1]):
            r = results[(rnd, w)] = measure(a, keyspace, w, call, f"round {rnd + 1} workers {w}")
            print(f"round {rnd + 1}: {report(f'workers {w}', r)}  (errors: {r['errors']})\n           {r['cpu']}", flush=True)
    print(f"\n{call} over TLS from ghz (-c {a.concurrency}, --connections {a.connections}), {a.seconds:g} s each, "
          f"{a.rounds} rounds in alternating order, {os.cpu_count()} cores")
    first = counts[0]
    for w in counts:
        rates = [results[(rnd, w)]["per_s"] for rnd in range(a.rounds)]
        ratios = [results[(rnd, w)]["per_s"] / results[(rnd, first)]["per_s"] for rnd in range(a.rounds)]
        print(f"workers {w}: {statistics.median(rates):.0f}/s median ({', '.join(f'{x:.0f}' for x in rates)}); "
              f"{statistics.median(ratios):.2f} of {first} worker(s) ({', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    run(main)

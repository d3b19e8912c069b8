"""The enqueue paths against the same writes done directly, in alternating order over rounds, with
two load clients (the Python one and ghz).

    make ghz          # once: ghz for the ghz phase (bench/ghz.py)
    .venv/bin/python -m bench.enqueue_rounds [--rounds 3] [--seconds 15] [--warmup 3] [--concurrency 128]
        [--size 10240] [--paths unary,ghz] [--warm-seconds 10] [--connections 4] [--settle-s 180] [--workers 1]

Paths (``--paths``, besides ``direct``, always measured): ``unary`` (Enqueue from the Python client,
``--concurrency`` callers), ``ghz`` (Enqueue from ghz, ``-c --concurrency --connections N``),
``stream`` (EnqueueStream), ``many`` (one EnqueueMany stream, ``--concurrency`` mails in flight),
``batchN`` (EnqueueBatches, N mails per message). gRPC goes over TLS, as deployed.

Why rounds: a phase measured right after the keyspace is created pays for its schema, flushes and
compactions, and one measured after a saturated phase pays for that phase's compactions. So the
keyspace is warmed first (each path writes for ``--warm-seconds``, unmeasured), every phase starts
once the stack is idle (common.settle), each on a queue of its own that is dropped after it, and
the order alternates (forward in odd rounds, reversed in even ones) so no path always goes first.

Per phase: mails/s, p50, p99; CPU ms per mail of every process (enqueue_svc, blob_svc, Cassandra,
RabbitMQ, MinIO, the client: ``bench`` for the Python client, ``ghz`` for ghz); and Cassandra
requests per mail by kind, from the writer's mailqueue_cassandra_statements_total (enqueue_svc's
/metrics for the service paths, this process's counter for the direct path). Each round prints
each path's ratio to that round's direct phase; the summary, the median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Callable
from typing import Any

import grpc

from bench import ghz
from bench.common import (
    PORTS,
    bench_queue,
    cassandra_statements,
    drop_queues,
    new_keyspace,
    report,
    run,
    settle,
    start_services,
    statements_line,
    stop,
)
from bench.enqueue_bench import direct, via_grpc, via_grpc_many, via_grpc_stream
from mailqueue.v1 import admin_pb2, admin_pb2_grpc
from services.runtime.settings import Settings
from stack.harness import ROOT

#: enqueue_svc's Prometheus port: its Cassandra requests by kind.
ENQUEUE_METRICS = 56164
PKI = os.path.join(ROOT, ".stack", "pki")


class Bench:
    """The services over TLS on one keyspace, and a runner per path."""

    def __init__(self, a: argparse.Namespace, keyspace: str) -> None:
        self.a = a
        self.ca = os.path.join(PKI, "ca.crt")
        with open(self.ca, "rb") as f:
            self.credentials = grpc.ssl_channel_credentials(f.read())
        tls = {"MAILQUEUE_TLS_CERT_FILE": os.path.join(PKI, "services.crt"),
               "MAILQUEUE_TLS_KEY_FILE": os.path.join(PKI, "services.key")}
        # --workers applies to enqueue_svc alone: the others' background rounds would double too.
        self.procs = start_services(keyspace, ["enqueue"], metrics={"enqueue": ENQUEUE_METRICS},
                                    extra={**tls, "MAILQUEUE_WORKERS": str(a.workers)}, credentials=self.credentials)
        self.procs += start_services(keyspace, ["blob", "browse"], extra=tls, credentials=self.credentials)
        self.services = {"blob_svc": self.procs[1].pid, "enqueue_svc": self.procs[0].pid}
        self.admin = admin_pb2_grpc.AdminServiceStub(
            grpc.secure_channel(f"127.0.0.1:{PORTS['browse']}", self.credentials))
        self.settings = Settings.from_env("enqueue", {**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace})

    def close(self) -> None:
        stop(self.procs)

    def measure(self, path: str, label: str, seconds: float, warmup: float) -> dict[str, Any]:
        """One phase of ``path`` on a new queue (dropped after it), once the stack is idle."""
        queue = bench_queue(f"bench-{path}-{label.replace(' ', '')}")
        if path != "direct":
            self.admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
        settle(f"{label} {path}", self.a.settle_s)
        try:
            return self._runner(path, queue, seconds, warmup)()
        finally:
            drop_queues([queue])  # its backlog would make the broker's next phases dearer

    def _runner(self, path: str, queue: str, seconds: float, warmup: float) -> Callable[[], dict[str, Any]]:
        a, services, tls = self.a, self.services, self.credentials
        served: Callable[[], dict[str, float]] = lambda: cassandra_statements(ENQUEUE_METRICS)  # noqa: E731
        if path == "direct":
            return lambda: asyncio.run(direct(self.settings, queue, seconds, a.concurrency, a.size, warmup,
                                              statements=cassandra_statements))
        if path == "unary":
            return lambda: asyncio.run(via_grpc(queue, seconds, a.concurrency, a.size, warmup, services,
                                                credentials=tls, statements=served))
        if path == "stream":
            return lambda: asyncio.run(via_grpc_stream(queue, seconds, a.concurrency, a.size, warmup, services,
                                                       credentials=tls, statements=served))
        if path == "ghz":
            return lambda: ghz.phase(queue, seconds, a.concurrency, a.size, warmup, services, self.ca,
                                     a.connections, statements=served)
        batch = 1 if path == "many" else int(path.removeprefix("batch"))
        return lambda: asyncio.run(via_grpc_many(queue, seconds, a.concurrency, a.size, warmup, services, batch,
                                                 tls, statements=served))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=3, help="seconds of load before measuring, each phase")
    p.add_argument("--warm-seconds", type=float, default=10, help="each path's unmeasured writes before round 1")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--connections", type=int, default=4, help="ghz's connections")
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--settle-s", type=float, default=180,
                   help="most seconds to wait for an idle stack before each phase (then it measures anyway, and says so)")
    p.add_argument("--workers", type=int, default=1,
                   help="MAILQUEUE_WORKERS of enqueue_svc: its processes on its port (services/runtime/workers.py)")
    p.add_argument("--paths", default="unary,ghz", help="comma-separated: unary, ghz, stream, many, batchN")
    a = p.parse_args()
    a.paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    for path in a.paths:
        if path not in ("unary", "ghz", "stream", "many") and not (path.startswith("batch") and path[5:].isdigit()):
            p.error(f"unknown path {path!r}")
    if "ghz" in a.paths:
        ghz.binary()  # before anything starts: stop now when it is missing
    return a


def phase_lines(path: str, r: dict[str, Any]) -> str:
    """A phase's report: rate and latency (and errors), CPU per mail, Cassandra requests per mail."""
    errors = r.get("errors")
    return (report(path, r) + (f"  (errors: {errors})" if errors else "")
            + f"\n           {r['cpu']}\n           {statements_line(r['stmts'])}")


def main() -> None:
    a = parse()
    phases = ["direct", *a.paths]
    keyspace = new_keyspace()
    bench = Bench(a, keyspace)
    results: dict[tuple[int, str], dict[str, Any]] = {}
    try:
        for path in phases:  # the warmed keyspace: every table written and flushed once
            bench.measure(path, "warm", a.warm_seconds, 0)
        for rnd in range(a.rounds):
            for path in (phases if rnd % 2 == 0 else phases[::-1]):
                r = results[(rnd, path)] = bench.measure(path, f"round {rnd + 1}", a.seconds, a.warmup)
                print(f"round {rnd + 1}: {phase_lines(path, r)}", flush=True)  # a run cut short keeps its phases
    finally:
        bench.close()
    print(f"\nenqueue of {a.size} B mails, concurrency {a.concurrency} (ghz: {a.connections} connections), gRPC over TLS, "
          f"enqueue_svc in {a.workers} worker process(es), "
          f"{a.seconds:.0f} s each after {a.warmup:.0f} s of warm-up, {a.rounds} rounds in alternating order, keyspace {keyspace}")
    for rnd in range(a.rounds):
        print(f"round {rnd + 1} ({' '.join(phases if rnd % 2 == 0 else phases[::-1])}):")
        for path in phases:
            print(phase_lines(path, results[(rnd, path)]))
        base = results[(rnd, "direct")]["per_s"]
        print(f"round {rnd + 1} ratio to direct: " + ", ".join(f"{p} {results[(rnd, p)]['per_s'] / base:.2f}" for p in a.paths))
    for path in a.paths:
        ratios = [results[(rnd, path)]["per_s"] / results[(rnd, "direct")]["per_s"] for rnd in range(a.rounds)]
        rates = [results[(rnd, path)]["per_s"] for rnd in range(a.rounds)]
        print(f"ratio {path}/direct throughput: {statistics.median(ratios):.2f} median of {a.rounds} rounds "
              f"({', '.join(f'{x:.2f}' for x in ratios)}); {statistics.median(rates):.0f}/s median")


if __name__ == "__main__":
    run(main)

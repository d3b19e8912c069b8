"""Benchmark helpers: service processes on a bench keyspace, a concurrent load loop, percentiles."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = {"blob": 56054, "enqueue": 56051, "dequeue": 56052, "browse": 56053}


def env(keyspace: str, name: str) -> dict[str, str]:
    """A service's environment; MAILQUEUE_BLOB_TARGET="" in the caller's environment keeps S3 direct."""
    e = dict(os.environ)
    e.update({
        "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace, "MAILQUEUE_PORT": str(PORTS[name]), "MAILQUEUE_METRICS_PORT": "0",
        "MAILQUEUE_BLOB_TARGET": os.environ.get("MAILQUEUE_BLOB_TARGET", f"127.0.0.1:{PORTS['blob']}"),
        "MAILQUEUE_LOG_LEVEL": "WARNING",
    })
    return e


def start_services(keyspace: str, names: list[str]) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-m", f"{n}_svc"], cwd=ROOT, env=env(keyspace, n)) for n in names]
    deadline = time.monotonic() + 90
    for n in names:
        while not serving(f"127.0.0.1:{PORTS[n]}"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{n}_svc did not become SERVING")
            time.sleep(0.2)
    return procs


def serving(target: str) -> bool:
    with grpc.insecure_channel(target) as ch:
        try:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1
        except grpc.RpcError:
            return False


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(20)


_KEYSPACES: list[str] = []


def new_keyspace() -> str:
    """A keyspace for one benchmark run, dropped when ``run`` ends (piles of keyspaces exhaust a
    small Cassandra heap)."""
    name = f"mq_bench_{uuid.uuid4().hex[:8]}"
    _KEYSPACES.append(name)
    return name


def run(main: Callable[[], None]) -> None:
    """A benchmark's entry point: its keyspaces are dropped however it ends."""
    try:
        main()
    finally:
        for name in _KEYSPACES:
            drop_keyspace(name)


def drop_keyspace(name: str) -> None:
    from services.config import CassandraSettings
    from services.view.session import connect

    cluster, session = connect(CassandraSettings.from_env())
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
    finally:
        cluster.shutdown()


async def load(op: Callable[[int], Awaitable[None]], concurrency: int, seconds: float, label: str) -> dict[str, float]:
    """Run ``op`` from ``concurrency`` workers for ``seconds``; report throughput and latency."""
    latencies: list[float] = []
    counter = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal counter
        while time.monotonic() < deadline:
            counter += 1
            start = time.perf_counter()
            await op(counter)
            latencies.append(time.perf_counter() - start)

    started = time.monotonic()

    async def progress() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(5)
            print(f"  [{label}] {time.monotonic() - started:4.0f}s {len(latencies)} done", file=sys.stderr)

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    reporter.cancel()
    elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "ops": len(latencies),
        "per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1],
    }


def report(name: str, r: dict[str, float]) -> str:
    return f"{name:<10} {r['ops']:>7.0f} ops  {r['per_s']:>8.1f}/s  p50 {r['p50_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms"

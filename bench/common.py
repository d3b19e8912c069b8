"""Benchmark helpers: service processes on a bench keyspace, a concurrent load loop, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc

from stack import harness
from stack.harness import ROOT, Service, as_service, prepare, stack_env
from stack.harness import scrape as metric  # noqa: F401 - the benches' reading of a service's metrics

PORTS = {"blob": 56054, "enqueue": 56051, "dequeue": 56052, "browse": 56053}


def use_stack() -> None:
    """The benches reach the backends as the operator, over TLS (stack/stack.sh env), unless the
    caller's environment names them already (the clusters: stack/stack.sh cluster-env)."""
    if "MAILQUEUE_CREDENTIALS_DIR" not in os.environ:
        os.environ.update(stack_env("operator"))


def env(keyspace: str, name: str, metrics_port: int = 0, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A service's environment, with its own backend credential: S3 directly, the default
    (MAILQUEUE_BLOB_TARGET=blob in the caller's environment measures the blob_svc hop instead).
    gRPC in the clear on loopback (MAILQUEUE_PLAINTEXT) unless the caller gives a certificate."""
    use_stack()
    e = dict(os.environ)
    e.update({
        "MAILQUEUE_CASSANDRA_KEYSPACE": keyspace, "MAILQUEUE_PORT": str(PORTS[name]), "MAILQUEUE_METRICS_PORT": str(metrics_port),
        "MAILQUEUE_LOG_LEVEL": "WARNING", **(extra or {}),
    })
    if not e.get("MAILQUEUE_TLS_CERT_FILE"):
        e["MAILQUEUE_PLAINTEXT"] = "true"
        e.pop("MAILQUEUE_TLS_CA_FILE", None)
    if os.environ.get("MAILQUEUE_BLOB_TARGET") == "blob":
        e["MAILQUEUE_BLOB_TARGET"] = f"127.0.0.1:{PORTS['blob']}"
    prepare(e)
    return as_service(name, e)


def start_services(keyspace: str, names: list[str], metrics: dict[str, int] | None = None,
                   extra: dict[str, str] | None = None, credentials: grpc.ChannelCredentials | None = None) -> list[Service]:
    """``names`` started on the bench ports (stack/harness.py's Service: ``.pid``, ``.proc``;
    their logs on this process's stderr); ``metrics``: name -> a Prometheus port to serve;
    ``extra``: variables over each one's environment (a TLS certificate: then ``credentials``
    are what a client trusts)."""
    taken = [n for n in names if serving(f"127.0.0.1:{PORTS[n]}", credentials)]
    if taken:
        # Left by a killed benchmark: this run's calls would reach them, and their keyspace.
        raise SystemExit(f"ports of {', '.join(taken)} ({', '.join(str(PORTS[n]) for n in taken)}) already answer: "
                         "stop those processes first (pkill -f 'python -m <name>_svc')")
    services = [Service(n, env(keyspace, n, (metrics or {}).get(n, 0), extra), PORTS[n], credentials=credentials)
                for n in names]
    for s in services:
        s.start(wait=False)
    deadline = time.monotonic() + 90
    try:
        for s in services:
            s.wait_serving(max(deadline - time.monotonic(), 0), interval=0.2)
    except harness.NotServing as e:
        stop(services)
        raise SystemExit(str(e)) from None
    return services


def serving(target: str, credentials: grpc.ChannelCredentials | None = None) -> bool:
    return harness.is_serving(target, credentials, timeout=1)


def stop(procs: list[Service] | list[subprocess.Popen]) -> None:
    """SIGTERM to each, then wait for each to end (SIGKILL after 20 s)."""
    harness.stop_all([p if isinstance(p, Service) else _adopted(p) for p in procs], grace=20)


def _adopted(proc: subprocess.Popen) -> Service:
    service = Service("?", {}, 0)
    service.proc = proc
    return service


#: What one benchmark run created, removed when ``run`` ends: piles of keyspaces exhausted a small
#: Cassandra heap, and leftover blobs and messages make MinIO's scanner and RabbitMQ busier
#: with every run, which skews the next run's figures.
_KEYSPACES: list[str] = []
_BUCKETS: list[str] = []
_QUEUES: list[str] = []
TAG = uuid.uuid4().hex[:8]


def new_keyspace() -> str:
    """A keyspace and a bucket for one benchmark run.

    The bucket is exported as MAILQUEUE_S3_BUCKET, so services started by ``start_services`` and
    settings read from the environment use it. Both are dropped when ``run`` ends.
    """
    name = f"mq_bench_{TAG}"
    _KEYSPACES.append(name)
    bucket = f"mq-bench-{TAG}"
    os.environ["MAILQUEUE_S3_BUCKET"] = bucket
    _BUCKETS.append(bucket)
    return name


def bench_queue(name: str) -> str:
    """A queue name unique to this run; its RabbitMQ exchanges and queues are deleted when ``run`` ends."""
    queue = f"{name}-{TAG}"
    _QUEUES.append(queue)
    return queue


def run(main: Callable[[], None]) -> None:
    """A benchmark's entry point: what it created is removed however it ends. It first says
    whether earlier runs left keyspaces or queues on the stack (bench/leftovers.py)."""
    from bench import leftovers

    use_stack()
    leftovers.warn_if_any()
    try:
        main()
    finally:
        for name in _KEYSPACES:
            drop_keyspace(name)
        for bucket in _BUCKETS:
            drop_bucket(bucket)
        drop_queues(_QUEUES)


def drop_keyspace(name: str) -> None:
    harness.drop_keyspace(name)


def empty_tables(keyspace: str, label: str) -> None:
    """TRUNCATE the mail tables of ``keyspace`` (the schema stays, and the servers stay warm), so
    that each phase starts from the same tables whatever ran before it: in one 6-round events run
    on a keyspace left to grow, the dequeue rate fell from 1,682/s to 825/s over the run and
    Cassandra's CPU per mail dequeued from 0.27 to 0.72 ms, as ever larger tables were flushed and
    compacted during the later phases (2026-12-05)."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    # What a mail's enqueue and delivery fill: content, view rows, marks, counters, history.
    tables = (schema.BLOBS, schema.ENQUEUED_MAILS, schema.DELETED_MAILS, schema.COUNTERS, schema.MAIL_HISTORY_GROUPS,
              schema.MAIL_HISTORY_NAMES, schema.MAIL_HISTORY)
    began = time.monotonic()
    cluster, session = connect(cassandra_from_env(os.environ))
    try:
        for table in tables:
            session.execute(f"TRUNCATE TABLE {keyspace}.{table}", timeout=120)
    finally:
        cluster.shutdown()
    print(f"  [{label}] emptied {len(tables)} tables in {time.monotonic() - began:.1f} s", file=sys.stderr)


def drop_bucket(bucket: str) -> None:
    if harness.drop_bucket(bucket):
        print(f"removed bucket {bucket}", file=sys.stderr)


def drop_queues(queues: list[str]) -> None:
    """The RabbitMQ queues of each bench queue: every priority class's work queue and the
    dead-letter queue, and the queue's exchanges (stack/harness.py drop_queues)."""
    harness.drop_queues(queues)


async def load(
    op: Callable[[int], Awaitable[None]], concurrency: int, seconds: float, label: str,
    warmup: float = 5.0, services: dict[str, int] | None = None, rate: float = 0.0,
    statements: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Run ``op`` from ``concurrency`` workers for ``warmup`` + ``seconds``; report the last ``seconds``.

    ``rate`` > 0 paces the starts to that many per second (an open load: each operation starts at
    its slot, ``concurrency`` at most in flight) to measure latency below the peak.

    Only operations started after the warm-up count (fresh processes, connections, JIT and caches
    settle first); a call that ends with a gRPC error is counted in ``errors`` by status, not
    measured. ``services`` (name -> pid) get their CPU time per operation measured over the same
    window, with the stack's servers and this process; ``statements`` (``cassandra_statements``
    of the process that writes) its Cassandra requests per operation, by kind (``stmts``).
    """
    latencies: list[float] = []
    errors: dict[str, int] = {}
    counter = 0
    began = time.monotonic()
    measure_from = began + warmup
    deadline = measure_from + seconds
    meter: list[CpuMeter] = []
    asyncio.get_running_loop().call_later(warmup, lambda: meter.append(CpuMeter(services or {}, statements)))

    async def worker() -> None:
        nonlocal counter
        while (now := time.monotonic()) < deadline:
            counter += 1
            if rate > 0 and (wait := began + counter / rate - now) > 0:
                await asyncio.sleep(wait)
                now = time.monotonic()
            start = time.perf_counter()
            try:
                await op(counter)
            except grpc.aio.AioRpcError as e:  # a refused call is counted, not measured
                errors[e.code().name] = errors.get(e.code().name, 0) + 1
                continue
            if now >= measure_from:
                latencies.append(time.perf_counter() - start)

    async def progress() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(5)
            print(f"  [{label}] {time.monotonic() - began:4.0f}s {len(latencies)} measured", file=sys.stderr)

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    reporter.cancel()
    elapsed = time.monotonic() - measure_from
    latencies.sort()
    return {
        "ops": len(latencies),
        "per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[max(int(len(latencies) * 0.99) - 1, 0)] if latencies else float("nan"),
        "cpu": meter[0].per_op(max(len(latencies), 1)),
        "stmts": meter[0].statements_per_op(len(latencies)),
        "errors": errors,
    }


def stack_pids() -> dict[str, int]:
    """The local stack's servers (stack/stack.sh writes .stack/<name>.pid); missing ones are left
    out. MAILQUEUE_BENCH_STACK=cluster: the clusters' nodes instead (stack.sh up --cluster)."""
    if os.environ.get("MAILQUEUE_BENCH_STACK") == "cluster":
        names = [f"cluster/{e}{i}" for e in ("cassandra", "rabbitmq") for i in (1, 2, 3)] + ["minio"]
    else:
        names = ["cassandra", "rabbitmq", "minio", "minio-plain"]  # minio-plain: up --plaintext-loopback
    pids = {}
    for name in names:
        try:
            with open(os.path.join(ROOT, ".stack", f"{name}.pid")) as f:
                pids[name.removeprefix("cluster/")] = int(f.read())
        except (OSError, ValueError):
            pass
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of a process and its live descendants (a service's workers under their
    supervisor, services/runtime/workers.py)."""
    total = cpu_seconds(pid)
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return total
    for child in children:
        with contextlib.suppress(OSError):
            total += tree_cpu_seconds(child)
    return total


class CpuMeter:
    """CPU time per operation of every process a phase runs on: where the cores go; and, given a
    ``statements`` source, the Cassandra requests per operation by kind over the same window."""

    def __init__(self, services: dict[str, int], statements: Callable[[], dict[str, float]] | None = None) -> None:
        self._pids = {**services, **stack_pids(), "bench": os.getpid()}
        self._trees = set(services)  # a service may be workers under a supervisor
        self._start = {name: self._cpu(name, pid) for name, pid in self._pids.items()}
        self._statements = statements
        self._statements_start = statements() if statements else {}

    def _cpu(self, name: str, pid: int) -> float:
        return tree_cpu_seconds(pid) if name in self._trees else cpu_seconds(pid)

    def statements_per_op(self, ops: float) -> dict[str, float]:
        """Cassandra requests per operation since the start, by kind (empty without a source)."""
        if self._statements is None:
            return {}
        now = self._statements()
        return {k: (n - self._statements_start.get(k, 0.0)) / max(ops, 1) for k, n in now.items()
                if n > self._statements_start.get(k, 0.0)}

    def per_op(self, ops: float, others: dict[str, float] | None = None) -> str:
        """CPU ms per operation of each process; ``others``: CPU seconds of processes measured
        another way over the same window (a load client run as a child: its rusage)."""
        used = {name: 1000 * (self._cpu(name, pid) - self._start[name]) / ops for name, pid in self._pids.items()}
        used.update({name: 1000 * seconds / ops for name, seconds in (others or {}).items()})
        total = sum(used.values()) or 1e-9  # a phase too short to be measured (a busy machine)
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in used.items())
        cores = os.cpu_count() or 1
        return f"CPU ms per op: {parts}; total {total:.2f} (at most {cores * 1000 / total:.0f}/s on {cores} cores)"


#: The stack counts as idle below this share of one core, over SETTLE_WINDOW_S.
SETTLE_IDLE_CORE = 0.10
SETTLE_WINDOW_S = 2.0


def flush_cassandra(label: str) -> None:
    """Flush the single node's memtables (``stack/stack.sh nodetool flush``), so that what earlier
    phases wrote is on disk before the next one starts. Without it a phase paid for flushing the
    phases before it: past the commit log's 32 MiB (stack/cassandra/cassandra.yaml.in) Cassandra
    flushes the memtables holding the oldest segment, and whichever phase tipped it over paid for
    the 10 KiB mails an enqueue phase left there. The cluster stack is left as it is."""
    if os.environ.get("MAILQUEUE_BENCH_STACK") == "cluster":
        return
    try:
        done = subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), "nodetool", "flush"], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print(f"  [{label}] nodetool flush did not answer within 120 s: measuring without it", file=sys.stderr)
        return
    if done.returncode:  # a stack started before JMX was enabled: `make down && make up`
        print(f"  [{label}] nodetool flush failed (rc {done.returncode}; a stack started without JMX? restart it): "
              f"{done.stderr.strip()[-200:]}", file=sys.stderr)


def settle(label: str, deadline_s: float = 180.0) -> float:
    """Flush Cassandra (``flush_cassandra``), wait until the stack's servers are idle again, and
    return the seconds it took.

    A phase that writes at full speed leaves Cassandra compacting (and flushing) for up to a
    minute after it; measured then, the next phase pays for the phase before it. Each phase
    starts once the servers' CPU over ``SETTLE_WINDOW_S`` is below ``SETTLE_IDLE_CORE`` of a
    core (they idle at about 0.01 here). Past ``deadline_s`` it goes on, and says so.
    """
    pids = stack_pids()
    began = time.monotonic()
    flush_cassandra(label)
    while True:
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(SETTLE_WINDOW_S)
        busy = sum(cpu_seconds(pid) - before[name] for name, pid in pids.items()) / SETTLE_WINDOW_S
        waited = time.monotonic() - began
        if busy < SETTLE_IDLE_CORE:
            print(f"  [{label}] stack idle ({busy:.2f} of a core) after {waited:.0f} s", file=sys.stderr)
            return waited
        if waited > deadline_s:
            print(f"  [{label}] stack still busy ({busy:.2f} of a core) after {waited:.0f} s: measuring anyway",
                  file=sys.stderr)
            return waited


def cassandra_statements(metrics_port: int | None = None) -> dict[str, float]:
    """mailqueue_cassandra_statements_total by kind: of the service serving metrics on
    ``metrics_port``, or (None) of this process (the direct path's writes)."""
    if metrics_port is not None:
        import re
        import urllib.request

        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        return {k: float(v) for k, v in
                re.findall(r'^mailqueue_cassandra_statements_total\{kind="([^"]*)"\} (\S+)$', body, re.M)}
    from services.adapters.cassandra.statement_kinds import STATEMENTS

    return {s.labels["kind"]: s.value for m in STATEMENTS.collect() for s in m.samples if s.name.endswith("_total")}


def statements_line(per_op: dict[str, float]) -> str:
    """``Cassandra requests per mail: total (kind n, ...)``, the largest first."""
    shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_op.items(), key=lambda kv: -kv[1]) if v >= 0.005)
    return f"Cassandra requests per mail: {sum(per_op.values()):.2f} ({shown})"


def report(name: str, r: dict[str, float]) -> str:
    return f"{name:<10} {r['ops']:>7.0f} ops  {r['per_s']:>8.1f}/s  p50 {r['p50_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms"


async def blob_store(settings: Any, view: Any) -> Any:
    """The services' blob layout from this process: small content in Cassandra, larger in S3."""
    from services.adapters.s3.store import S3BlobStore
    from services.runtime.backends import tiered

    s3 = S3BlobStore(settings.s3, settings.limits.max_blob_bytes)
    await s3.ensure_bucket()
    return tiered(settings, view, s3)


async def write_backlog(settings: Any, queue: str, n: int, content: bytes, delay: Any = None, label: str = "backlog") -> float:
    """``n`` mails of one shared content in ``queue``, written as Enqueue writes them (blob, row,
    counters, confirmed publish; ``delay``: a datetime.timedelta through the delay ladder), from
    this process for speed. Returns the seconds it took."""
    import datetime as dt

    from services.adapters.cassandra.view import View
    from services.adapters.rabbitmq.broker import RabbitMQBroker
    from services.domain import model
    from services.domain.slices import bucket_of, slice_start

    view = await View.open(settings.cassandra)
    broker = RabbitMQBroker(settings.rabbitmq, settings.cassandra.keyspace)
    blobs = await blob_store(settings, view)
    info = await blobs.put_bytes(content)
    mail = model.Mail(name=label, sender="a@example.com", recipients=("b@example.org",))
    window = (await view.config.current()).slice_window
    began = time.monotonic()
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            now, eid = model.utcnow(), uuid.uuid4()
            q = model.QueuedMail(queue, eid, now, mail, (info.blob_id,), info.size, slice_start(now, window),
                                 bucket_of(mail.name, str(eid), 1), deliver_at=now + delay if delay else None)
            await view.mails.store(q)
            await view.mails.count(q, enqueued=1, delayed=1 if delay else 0)
            await broker.publish(q, delay or dt.timedelta(0))
            if i % 10000 == 0:
                print(f"  [{label}] {i}/{n} after {time.monotonic() - began:.0f} s", file=sys.stderr)

    try:
        await asyncio.gather(*(worker() for _ in range(64)))
    finally:
        await broker.close()
        await blobs.close()
        view.close()
    return time.monotonic() - began



def rabbitmqctl(*args: str) -> None:
    subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), "rabbitmqctl", *args], check=True, capture_output=True)


@contextlib.contextmanager
def own_vhost() -> Iterator[str]:
    """A RabbitMQ vhost for this run (MAILQUEUE_RABBITMQ_URL points at it), deleted at the end
    with everything in it (the delay ladder's waiting messages too)."""
    vhost = f"mq-bench-{TAG}"
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    os.environ["MAILQUEUE_RABBITMQ_URL"] = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    try:
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)

"""Many consumers on several dequeue_svc processes, and SIGKILL of enqueue_svc and dequeue_svc.

Invariants (DESIGN §5): an acknowledged enqueue is never lost; a mail is delivered at least once;
duplicates happen only for deliveries whose SUCCESS the killed server never processed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue as q
import threading
import time
import uuid

import grpc

from mailqueue.v1 import dequeue_pb2_grpc, enqueue_pb2_grpc
from tests.harness import ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, heal_counters, inline, message_count, simple_mail


def enqueue_many(stub, queue: str, n: int, workers: int = 16) -> list[str]:
    def one(i: int) -> str:
        return stub.Enqueue(inline(queue, simple_mail(f"m{i}")), timeout=30).receipt.enqueue_id

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(n)))


class Drain:
    """Consumers in threads answering SUCCESS; records every delivery per enqueue id."""

    def __init__(self) -> None:
        self.deliveries: collections.Counter[str] = collections.Counter()
        self.by_consumer: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        #: How consumers ended early (expected only where a test kills a server).
        self.errors: list[str] = []

    def run(self, target: str, queue: str, label: str, prefetch: int = 8) -> None:
        def loop() -> None:
            try:
                c = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(target)), queue, prefetch)
            except Exception as e:  # noqa: BLE001 - the server was killed before the stream opened
                self.errors.append(f"{label} could not subscribe: {e!r}")
                return
            while not self.stop.is_set():
                try:
                    d = c.next(timeout=0.5)
                except q.Empty:
                    continue
                except EOFError:
                    # The server died: this consumer is gone, as a crashed client's would be.
                    self.errors.append(f"{label} stream ended: {c.error!r}")
                    return
                with self.lock:
                    self.deliveries[d.mail.enqueue_id] += 1
                    self.by_consumer[label] += 1
                c.answer(d)
            c.close()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def test_1000_mails_through_4_consumers_on_2_processes_each_acked_once(suite, keyspace):
    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target)
    d1, d2 = ServiceProcess("dequeue", env), ServiceProcess("dequeue", env)
    try:
        queue = suite.new_queue()
        ids = enqueue_many(suite.enqueue_stub, queue, 1000)
        drain = Drain()
        for i, proc in enumerate([d1, d1, d2, d2]):
            drain.run(proc.target, queue, f"consumer{i}")
        wait_until(lambda: len(drain.deliveries) == 1000, 120, interval=0.2, what="1000 mails delivered")
        wait_until(lambda: message_count(queue) == 0, 30, what="queue empty")
        drain.join()
        assert not drain.errors, drain.errors  # no server was killed: every stream lived to the end
        assert set(drain.deliveries) == set(ids)
        assert max(drain.deliveries.values()) == 1  # each mail delivered and acked exactly once
        assert all(drain.by_consumer[f"consumer{i}"] > 0 for i in range(4)), drain.by_consumer
        print(f"\nper consumer: {dict(drain.by_consumer)}")
    finally:
        d1.stop()
        d2.stop()


def test_kill_9_of_dequeue_svc_mid_stream_loses_nothing(suite, keyspace):
    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target)
    d1, d2 = ServiceProcess("dequeue", env), ServiceProcess("dequeue", env)
    try:
        queue = suite.new_queue()
        ids = enqueue_many(suite.enqueue_stub, queue, 600)
        drain = Drain()
        for i, proc in enumerate([d1, d1, d2, d2]):
            drain.run(proc.target, queue, f"consumer{i}")
        wait_until(lambda: len(drain.deliveries) >= 200, 60, interval=0.05, what="work under way")
        d1.kill9()
        wait_until(lambda: set(drain.deliveries) >= set(ids), 120, interval=0.2, what="every mail delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue empty")
        drain.join()
        duplicates = sum(n - 1 for n in drain.deliveries.values())
        print(f"\nkill -9 dequeue_svc: {len(ids)} mails, {duplicates} delivered twice, per consumer {dict(drain.by_consumer)}")
        # Duplicates only for deliveries in flight on the killed process: 2 streams x prefetch 8.
        assert duplicates <= 16
        heal_counters(suite, queue)
    finally:
        d1.stop()
        d2.stop()


def test_kill_9_of_enqueue_svc_mid_load_loses_no_acknowledged_mail(suite, keyspace):
    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target)
    e1 = ServiceProcess("enqueue", env)
    queue = suite.new_queue()
    acknowledged: list[str] = []
    failed = 0
    lock = threading.Lock()
    stop = threading.Event()

    def produce() -> None:
        nonlocal failed
        stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(e1.target))
        while not stop.is_set():
            try:
                r = stub.Enqueue(inline(queue, simple_mail(uuid.uuid4().hex)), timeout=10)
            except grpc.RpcError:
                with lock:
                    failed += 1
                stop.wait(0.05)  # a producer's retry pause while the service is down
                continue
            with lock:
                acknowledged.append(r.receipt.enqueue_id)

    # 24 producers at once: their calls run in groups (services/app/grouping.py), so the kill
    # lands in the middle of groups too.
    producers = [threading.Thread(target=produce, daemon=True) for _ in range(24)]
    try:
        for t in producers:
            t.start()
        wait_until(lambda: len(acknowledged) >= 150, 60, interval=0.02, what="load under way")
        e1.kill9()
        e1.start()  # start-up is recovery: nothing to replay, nothing to repair
        wait_until(lambda: len(acknowledged) >= 300, 60, interval=0.05, what="load resumed after restart")
        stop.set()
        for t in producers:
            t.join(15)
        drain = Drain()
        for i in range(2):
            drain.run(suite.dequeue.target, queue, f"consumer{i}")
        wait_until(lambda: set(drain.deliveries) >= set(acknowledged), 120, interval=0.2,
                   what="every acknowledged enqueue delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue empty")
        drain.join()
        extra = set(drain.deliveries) - set(acknowledged)
        duplicates = sum(n - 1 for n in drain.deliveries.values())
        print(f"\nkill -9 enqueue_svc: {len(acknowledged)} acknowledged, all delivered; {failed} attempts failed "
              f"during the outage; {len(extra)} unacknowledged mails delivered; {duplicates} duplicates")
        assert duplicates == 0
        assert len(extra) <= len(producers)  # at most one in-flight enqueue per producer completed without its reply
        heal_counters(suite, queue)
    finally:
        stop.set()
        e1.stop()


def test_kill_9_between_claim_and_completion_gives_each_key_one_mail(suite, keyspace):
    """Idempotency across a crash: 20 SIGKILLs of enqueue_svc at random instants under load, each
    producer retrying its key until OK (a claim the killed process left is taken over after
    MAILQUEUE_ABANDONED_CLAIM_S, here 2 s). Every key maps to one enqueue id, delivered once, and
    no other mail is delivered."""
    import random

    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target, MAILQUEUE_ABANDONED_CLAIM_S="2")
    e1 = ServiceProcess("enqueue", env)
    queue = suite.new_queue()
    ids: dict[str, set[str]] = collections.defaultdict(set)
    lock = threading.Lock()
    stop = threading.Event()
    aborted = 0

    def enqueue_until_ok(stub, key: str) -> str:
        nonlocal aborted
        deadline = time.monotonic() + 90
        while True:
            try:
                return stub.Enqueue(inline(queue, simple_mail(key), key=key), timeout=10).receipt.enqueue_id
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    raise
                if e.code() == grpc.StatusCode.ABORTED:
                    with lock:
                        aborted += 1
                threading.Event().wait(0.05)  # the client's pause before its retry

    def produce(p: int) -> None:
        stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(e1.target))
        i = 0
        while not stop.is_set():
            key = f"p{p}-{i}"
            first = enqueue_until_ok(stub, key)  # a key once started is retried until OK, even after stop
            again = enqueue_until_ok(stub, key) if i % 4 == 0 else first  # a client whose answer was lost
            with lock:
                ids[key].update((first, again))
            i += 1

    producers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(8)]
    try:
        for t in producers:
            t.start()
        rng = random.Random(7)
        for _ in range(20):
            target = len(ids) + rng.randint(2, 25)
            wait_until(lambda: len(ids) >= target, 120, interval=0.01, what="load under way")
            e1.kill9()
            e1.start()
        stop.set()
        for t in producers:
            t.join(120)
        assert not any(t.is_alive() for t in producers)
        two = {k: v for k, v in ids.items() if len(v) != 1}
        assert not two, f"keys with two enqueue ids: {two}"
        acked = {next(iter(v)) for v in ids.values()}
        drain = Drain()
        drain.run(suite.dequeue.target, queue, "consumer")
        wait_until(lambda: set(drain.deliveries) >= acked, 120, interval=0.2, what="every key's mail delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue empty")
        drain.join()
        extra = set(drain.deliveries) - acked
        duplicates = sum(n - 1 for n in drain.deliveries.values())
        print(f"\nidempotency across 20 kill -9: {len(ids)} keys, one enqueue id each; {aborted} retries answered ABORTED "
              f"(claim in progress); {len(extra)} other mails delivered; {duplicates} duplicates")
        assert not extra and duplicates == 0
    finally:
        stop.set()
        e1.stop()

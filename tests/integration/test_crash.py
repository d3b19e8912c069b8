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

from mailqueue.v1 import browse_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc
from services.adapters.cassandra import schema
from stack.harness import ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, heal_counters, inline, message_count, one_event_each, simple_mail, view_rows


class Producers:
    """``threads`` producers calling ``call`` (an enqueue, returning its enqueue id) until stopped:
    the ids acknowledged, and the calls that failed (each producer pauses ``pause`` s after one,
    as a client retrying would)."""

    def __init__(self, call, threads: int, pause: float = 0.0) -> None:
        self.call, self.threads, self.pause = call, threads, pause
        self.acknowledged: list[str] = []
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = [threading.Thread(target=self._produce, daemon=True) for _ in range(threads)]

    def _produce(self) -> None:
        while not self._stop.is_set():
            try:
                enqueue_id = self.call()
            except grpc.RpcError:
                with self._lock:
                    self.failed += 1
                self._stop.wait(self.pause)
                continue
            with self._lock:
                self.acknowledged.append(enqueue_id)

    def start(self) -> None:
        for t in self._running:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._running:
            if t.is_alive():
                t.join(15)


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
        repeated, _ = one_event_each(suite, queue, ids)
        print(f"\nkill -9 dequeue_svc: {len(ids)} mails, {duplicates} delivered twice, per consumer {dict(drain.by_consumer)}; "
              f"one ENQUEUED and one DELIVERED event id per mail in history and stream ({repeated} stream messages repeated an id)")
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
    stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(e1.target))
    # 24 producers at once: their calls run in groups (services/app/enqueue_group.py), so the kill
    # lands in the middle of groups too.
    load = Producers(lambda: stub.Enqueue(inline(queue, simple_mail(uuid.uuid4().hex)), timeout=10).receipt.enqueue_id, 24,
                     pause=0.05)
    acknowledged = load.acknowledged
    try:
        load.start()
        wait_until(lambda: len(acknowledged) >= 150, 60, interval=0.02, what="load under way")
        e1.kill9()
        e1.start()  # start-up is recovery: nothing to replay, nothing to repair
        wait_until(lambda: len(acknowledged) >= 300, 60, interval=0.05, what="load resumed after restart")
        load.stop()
        drain = Drain()
        for i in range(2):
            drain.run(suite.dequeue.target, queue, f"consumer{i}")
        wait_until(lambda: set(drain.deliveries) >= set(acknowledged), 120, interval=0.2,
                   what="every acknowledged enqueue delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue empty")
        drain.join()
        extra = set(drain.deliveries) - set(acknowledged)
        duplicates = sum(n - 1 for n in drain.deliveries.values())
        print(f"\nkill -9 enqueue_svc: {len(acknowledged)} acknowledged, all delivered; {load.failed} attempts failed "
              f"during the outage; {len(extra)} unacknowledged mails delivered; {duplicates} duplicates")
        assert duplicates == 0
        assert len(extra) <= load.threads  # at most one in-flight enqueue per producer completed without its reply
        # Every acknowledged enqueue: one ENQUEUED event id, in history and stream; every delivered
        # mail (its SUCCESS confirmed): one DELIVERED. An enqueue the kill cut (no client was told it
        # was enqueued) may have its ENQUEUED event in the history and not yet in the stream: its
        # record writes the history, then the stream. Others with events: an enqueue cut after its
        # record, its mail queued but not yet published (the healer republishes it), reported.
        repeated, other = one_event_each(suite, queue, set(acknowledged), types=("ENQUEUED",), others=True)
        repeated_delivered, _ = one_event_each(suite, queue, set(drain.deliveries), types=("DELIVERED",), others=True)
        print(f"events: one ENQUEUED id per acknowledged mail, one DELIVERED id per delivered mail; "
              f"{repeated + repeated_delivered} stream messages repeated an id; {other} other mails with events")
        heal_counters(suite, queue)
    finally:
        load.stop()
        e1.stop()


#: SIGKILLs of the enqueuer under keyed load, each at a random point of the claim protocol (20 took
#: 121 s on a loaded 2-core machine; the suite runs 10).
KILLS = 10


def test_kill_9_between_claim_and_completion_gives_each_key_one_mail(suite, keyspace):
    """Idempotency across a crash: 20 SIGKILLs of enqueue_svc at random instants under load, each
    producer retrying its key until OK (a claim the killed process left is taken over once its
    lease has expired, MAILQUEUE_CLAIM_LEASE_S: 3 s). Every key maps to one enqueue id, delivered
    once, and no other mail is delivered."""
    import random

    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target)
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
        for _ in range(KILLS):
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
        listed = collections.Counter(r.mail.enqueue_id for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue)))
        assert set(listed) == acked and max(listed.values()) == 1, f"listed twice: {[i for i, n in listed.items() if n > 1]}"
        drain = Drain()
        drain.run(suite.dequeue.target, queue, "consumer")
        wait_until(lambda: set(drain.deliveries) >= acked, 120, interval=0.2, what="every key's mail delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue empty")
        drain.join()
        extra = set(drain.deliveries) - acked
        duplicates = sum(n - 1 for n in drain.deliveries.values())
        print(f"\nidempotency across {KILLS} kill -9: {len(ids)} keys, one enqueue id each; {aborted} retries answered ABORTED "
              f"(claim in progress); {len(extra)} other mails delivered; {duplicates} duplicates")
        assert not extra and duplicates == 0
    finally:
        stop.set()
        e1.stop()


def claim_row(suite, queue: str, key: str):
    """The key's idempotency row (enqueue_id, owner, committed), or None."""
    return suite.view.session.execute(
        f"SELECT enqueue_id, owner, committed FROM {suite.keyspace}.{schema.IDEMPOTENCY} "
        "WHERE queue_name = %s AND idempotency_key = %s", (queue, key)).one()


def test_a_key_held_by_a_killed_enqueuer_is_taken_over_within_5_s(suite, keyspace):
    """#47.6: enqueue_svc SIGKILLed while it holds a key's claim (mid-call: its EnqueueStream waits
    for the rest of the content). The claim names the killed process's lease; once the lease has
    expired (MAILQUEUE_CLAIM_LEASE_S, 3 s), the next retry through another replica takes it over
    with its enqueue id, well before MAILQUEUE_ABANDONED_CLAIM_S (30 s). One mail for the key."""
    e1 = ServiceProcess("enqueue", service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target))
    queue, key = suite.new_queue(), f"held-{uuid.uuid4().hex[:8]}"
    hold = threading.Event()

    def requests():
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(
            queue=queue, mail=simple_mail("held"), idempotency_key=key))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=b"Subject: held\r\n\r\nthe rest never comes")
        hold.wait(60)  # the call stays open: e1 holds the claim while it waits for the content

    aborted = 0

    def retried():
        """A client's retry of the key through the other replica: its receipt, None on ABORTED."""
        nonlocal aborted
        try:
            return suite.enqueue_stub.Enqueue(inline(queue, simple_mail("held"), key=key), timeout=10).receipt
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.ABORTED, e.details()
            aborted += 1
            return None

    try:
        call = enqueue_pb2_grpc.EnqueueServiceStub(e1.channel()).EnqueueStream.future(requests(), timeout=60)
        # Given e1 holds the key's claim, naming its lease, and a retry meanwhile is told "in progress"
        held = wait_until(lambda: claim_row(suite, queue, key), 30, what="e1 to claim the key")
        assert held.owner is not None and not held.committed
        assert retried() is None and aborted == 1
        # When e1 is killed mid-call
        e1.kill9()
        killed = time.monotonic()
        # Then a client retrying every 0.1 s gets OK within 5 s, with the claim's enqueue id
        receipt = wait_until(retried, 30, interval=0.1, what="the retried key to answer OK")
        took = time.monotonic() - killed
        assert call.exception() is not None  # the killed call failed: nothing was acknowledged to it
        assert (receipt.enqueue_id, receipt.duplicate) == (str(held.enqueue_id), False)
        assert took < 5, f"first OK {took:.1f} s after the SIGKILL"
        now = claim_row(suite, queue, key)
        assert now.committed and now.owner != held.owner
        # And the key is one mail, delivered once
        assert [r.enqueue_id for r in view_rows(suite, queue)] == [held.enqueue_id]
        consumer = StreamConsumer(suite.dequeue_stub, queue)
        d = consumer.next()
        assert d.mail.enqueue_id == receipt.enqueue_id
        consumer.answer(d)
        consumer.close()
        wait_until(lambda: message_count(queue) == 0, 30, what="the queue empty")
        print(f"\nkey held by a killed enqueuer: first OK {took:.2f} s after its SIGKILL "
              f"({aborted - 1} retries answered ABORTED meanwhile)")
    finally:
        hold.set()
        e1.stop()

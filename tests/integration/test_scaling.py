"""Two replicas of every service on loopback behind client-side round_robin; SIGKILL of one
replica of each half-way. Zero acknowledged mails lost; both replicas worked before the kill."""

from __future__ import annotations

import collections
import queue as q
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mailqueue.v1 import dequeue_pb2_grpc, enqueue_pb2_grpc
from services.adapters.grpc_channels import blocking_channel
from stack.harness import ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, inline, message_count, simple_mail

MAILS = 2000
LARGE = b"Subject: large\r\n\r\n" + b"x" * 70_000


def balanced(*replicas: ServiceProcess) -> str:
    """One target naming every replica: the channel's round_robin spreads calls over them."""
    return "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in replicas)


def test_two_replicas_each_with_one_killed_half_way(suite, keyspace):
    env = service_env(keyspace)
    blobs = [ServiceProcess("blob", env, metrics=True) for _ in range(2)]
    env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=balanced(*blobs))
    enqueues = [ServiceProcess("enqueue", env, metrics=True) for _ in range(2)]
    dequeues = [ServiceProcess("dequeue", env, metrics=True) for _ in range(2)]
    everything = blobs + enqueues + dequeues
    queue = suite.new_queue()
    acknowledged: dict[int, str] = {}
    deliveries: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()
    try:
        enqueue_stub = enqueue_pb2_grpc.EnqueueServiceStub(blocking_channel(balanced(*enqueues)))
        # One channel for every consumer: round_robin spreads its streams over the replicas once
        # both subchannels are connected (a few calls on the channel bring them up).
        dequeue_channel = blocking_channel(balanced(*dequeues))
        health = health_pb2_grpc.HealthStub(dequeue_channel)
        for _ in range(20):
            health.Check(health_pb2.HealthCheckRequest(), timeout=5, wait_for_ready=True)
        dequeue_stub = dequeue_pb2_grpc.DequeueServiceStub(dequeue_channel)
        todo: q.Queue[int] = q.Queue()
        for i in range(MAILS):
            todo.put(i)

        def produce() -> None:
            while not stop.is_set():
                try:
                    i = todo.get_nowait()
                except q.Empty:
                    return
                try:  # the key makes a retry after a lost reply return the first enqueue
                    # Every tenth mail is over 64 KiB: its content goes through blob_svc to S3.
                    content = LARGE if i % 10 == 0 else b"Subject: t\r\n\r\nhello\r\n"
                    r = enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}"), content, key=f"mail-{i}"), timeout=15)
                except grpc.RpcError:
                    todo.put(i)  # retried later, on whichever replica answers
                    continue
                with lock:
                    acknowledged[i] = r.receipt.enqueue_id

        def consume() -> None:
            while not stop.is_set():
                try:
                    c = StreamConsumer(dequeue_stub, queue, 8)
                except Exception:  # noqa: BLE001 - a replica just died: open a new stream
                    continue
                while not stop.is_set():
                    try:
                        d = c.next(timeout=0.5)
                    except q.Empty:
                        continue
                    except EOFError:
                        break  # the stream's replica was killed: reconnect to the survivor
                    with lock:
                        deliveries[d.mail.enqueue_id] += 1
                    c.answer(d)
                c.cancel()

        threads = [threading.Thread(target=produce, daemon=True) for _ in range(8)]
        threads += [threading.Thread(target=consume, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acknowledged) >= MAILS // 2, 120, interval=0.05, what="half the mails acknowledged")
        before = {
            "enqueue": [r.metric("mailqueue_rpc_total", method="Enqueue", code="OK") for r in enqueues],
            "blob": [r.metric("mailqueue_rpc_total", method="PutBytes", code="OK") for r in blobs],
            "dequeue": [r.metric("mailqueue_delivered_total") for r in dequeues],
        }
        for victim in (enqueues[0], dequeues[0], blobs[0]):
            victim.kill9()
        wait_until(lambda: len(acknowledged) == MAILS, 180, interval=0.1, what="every mail acknowledged")
        wait_until(lambda: set(deliveries) >= set(acknowledged.values()), 180, interval=0.1,
                   what="every acknowledged mail delivered")
        wait_until(lambda: message_count(queue) == 0, 60, what="queue drained")
        stop.set()
        for t in threads:
            t.join(10)
        duplicates = sum(n - 1 for n in deliveries.values())
        print(f"\nper replica before the kill: {before}; {len(acknowledged)} acknowledged, "
              f"{len(set(acknowledged.values()))} distinct, {duplicates} delivered twice")
        assert len(set(acknowledged.values())) == MAILS  # idempotency keys: no mail enqueued twice
        assert set(deliveries) == set(acknowledged.values())  # nothing lost, nothing unknown delivered
        for kind, counts in before.items():
            assert all(c > 0 for c in counts), (kind, counts)
        assert duplicates <= 2 * 8  # only deliveries in flight on the killed dequeue replica
    finally:
        stop.set()
        for r in everything:
            r.stop()

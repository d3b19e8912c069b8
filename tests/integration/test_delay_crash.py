"""Delayed mails survive SIGKILL of every service and a RabbitMQ restart: none lost, none early.

Runs with the outage tests (it restarts RabbitMQ).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import queue as q
import random
import threading

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, dequeue_pb2_grpc, enqueue_pb2_grpc
from services.domain import model
from stack.harness import ServiceProcess, broker_stopped, service_env, wait_until
from tests.integration.helpers import StreamConsumer, inline, simple_mail

pytestmark = pytest.mark.outage

MAILS = 1000
#: Each mail is due this many seconds after the first enqueue, plus up to 10: the 1,000 enqueues
#: and the kills must end before the first is due, also on a machine the rest of the suite loads
#: (15 s left little margin there at 16 callers).
DELAY_S = 30


def test_1000_delayed_mails_survive_kill9_of_every_service_and_a_rabbitmq_restart(suite, keyspace):
    env = service_env(keyspace)
    blob = ServiceProcess("blob", env)
    env = {**env, "MAILQUEUE_BLOB_TARGET": blob.target}
    procs = {name: ServiceProcess(name, env) for name in ("enqueue", "dequeue", "browse")}
    procs["blob"] = blob
    try:
        queue = f"delay-crash-{random.randrange(10**6)}"
        admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(procs["browse"].target)).CreateQueue(
            admin_pb2.CreateQueueRequest(queue=queue))
        enqueue = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(procs["enqueue"].target))
        start = model.utcnow()
        due: dict[str, dt.datetime] = {}

        def one(i: int) -> None:
            r = inline(queue, simple_mail(f"m{i}"))
            at = start + dt.timedelta(seconds=DELAY_S + random.uniform(0, 10))
            r.deliver_at.FromDatetime(at)
            due[enqueue.Enqueue(r, timeout=30).receipt.enqueue_id] = at

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(MAILS)))
        assert len(due) == MAILS
        # Every service dies at once, then the broker restarts, while every mail is still delayed.
        for p in procs.values():
            p.kill9()
        took = (model.utcnow() - start).total_seconds()
        assert model.utcnow() < min(due.values()), f"the enqueues and kills took {took:.1f} s: the test proves nothing"
        with broker_stopped():  # stopped, and started again on leaving
            pass
        for name in ("blob", "enqueue", "dequeue", "browse"):
            procs[name].start()

        received: dict[str, list[dt.datetime]] = {}
        lock = threading.Lock()
        c = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(procs["dequeue"].target)), queue, 64)

        def drain() -> bool:
            while True:
                try:
                    d = c.next(timeout=0.2)
                except q.Empty:
                    return len(received) == MAILS
                with lock:
                    received.setdefault(d.mail.enqueue_id, []).append(model.utcnow())
                c.answer(d)

        try:
            # Up to the broker's at-least-once dead-letter retry (5 s in the local stack) late.
            wait_until(drain, timeout=90, interval=0.1, what="every delayed mail delivered")
        except AssertionError as e:
            raise AssertionError(f"{e}: {len(received)} of {MAILS} delivered") from None
        c.close()
        assert set(received) == set(due)  # none lost
        early = {eid: (due[eid] - times[0]) for eid, times in received.items() if times[0] < due[eid]}
        assert early == {}  # none early
        late = sorted((times[0] - due[eid]).total_seconds() for eid, times in received.items())
        duplicates = sum(len(t) - 1 for t in received.values())
        print(f"lateness p50 {late[len(late) // 2]:.2f}s p99 {late[int(len(late) * 0.99)]:.2f}s; duplicates {duplicates}")
        # The counters after the campaign: their drift, then healed by a reconcile.
        counted = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info
        exact = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue, exact=True)).queue_info
        print(f"counter drift after kill -9: size {counted.size - exact.size:+d}, delayed {counted.delayed - exact.delayed:+d}")
        r = suite.admin_stub.ReconcileCounters(admin_pb2.ReconcileCountersRequest(queue=queue))
        assert (r.size_after, r.delayed_after) == (exact.size, exact.delayed) == (0, 0)
    finally:
        for p in procs.values():
            p.stop()

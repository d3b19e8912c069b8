"""MAILQUEUE_WORKERS: several processes of one service on one port, under a supervisor
(services/runtime/workers.py), driven as a client would: through the port, the metrics and signals.

- Both workers serve the port (the ENQUEUED events name the worker that wrote them).
- The supervisor's metrics hold every worker's: a gauge per live worker, counters summed.
- kill -9 of a worker under load: no acknowledged mail lost, the worker started again.
- kill -9 of the supervisor: the workers end by themselves and the port is free.
"""

from __future__ import annotations

import os
import socket
import uuid

import grpc
import pytest

from mailqueue.v1 import enqueue_pb2_grpc, events_pb2, events_pb2_grpc
from stack.harness import ServiceProcess, free_port, scrape, service_env, wait_until
from tests.integration.helpers import inline, simple_mail
from tests.integration.test_crash import Drain, Producers


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def workers(suite, keyspace):
    s = ServiceProcess("enqueue", service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target, MAILQUEUE_WORKERS="2"),
                       metrics=True)
    try:
        wait_until(lambda: len(children(s.pid)) == 2, 30, what="two workers")
        wait_until(lambda: scrape(s.metrics_port, "mailqueue_serving") == 2, 60, what="both workers SERVING")
        yield s
    finally:
        s.stop(grace=30)


def replicas(suite, ids: list[str]) -> set[str]:
    events = events_pb2_grpc.EventServiceStub(suite.browse.channel())
    seen = set()
    for enqueue_id in ids:
        story = events.GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=enqueue_id), timeout=10).events
        seen |= {e.replica for e in story if e.type == events_pb2.EVENT_TYPE_ENQUEUED}
    return seen


def test_two_workers_serve_one_port_and_their_metrics_are_served_together(suite, workers):
    queue = suite.new_queue()
    ids = []
    for i in range(24):  # a connection each: the kernel spreads connections over the workers
        with grpc.insecure_channel(workers.target) as channel:
            stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
            ids.append(stub.Enqueue(inline(queue, simple_mail(f"w{i}")), timeout=30).receipt.enqueue_id)
    seen = replicas(suite, ids)
    # hostname/enqueue/1 and hostname/enqueue/2 (2 / 2**24 that one worker took every connection)
    assert {tuple(r.rsplit("/", 2)[1:]) for r in seen} == {("enqueue", "1"), ("enqueue", "2")}, seen
    # One series of the serving gauge per live worker, and the RPCs of both counted in one sum.
    pids = sorted(str(p) for p in children(workers.pid))
    assert [scrape(workers.metrics_port, "mailqueue_serving", pid=p) for p in pids] == [1, 1]
    assert scrape(workers.metrics_port, "mailqueue_rpc_total", method="Enqueue", code="OK") >= 24


def test_a_worker_killed_under_load_is_started_again_and_loses_no_acknowledged_mail(suite, workers):
    queue = suite.new_queue()

    def one() -> str:
        with grpc.insecure_channel(workers.target) as channel:  # a connection per call: both workers
            stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)
            return stub.Enqueue(inline(queue, simple_mail(uuid.uuid4().hex)), timeout=10).receipt.enqueue_id

    load = Producers(one, 8)
    acknowledged = load.acknowledged
    try:
        load.start()
        wait_until(lambda: len(acknowledged) >= 100, 60, interval=0.02, what="load under way")
        killed = children(workers.pid)[0]
        os.kill(killed, 9)
        wait_until(lambda: len(children(workers.pid)) == 2 and killed not in children(workers.pid), 30,
                   what="the killed worker started again")
        at_restart = len(acknowledged)
        wait_until(lambda: scrape(workers.metrics_port, "mailqueue_serving") == 2, 60, what="both workers SERVING again")
        wait_until(lambda: len(acknowledged) >= at_restart + 100, 60, interval=0.05, what="load goes on")
        load.stop()
        drain = Drain()
        drain.run(suite.dequeue.target, queue, "consumer")
        wait_until(lambda: set(drain.deliveries) >= set(acknowledged), 120, interval=0.2,
                   what="every acknowledged enqueue delivered")
        drain.join()
        print(f"\nkill -9 of one of 2 workers: {len(acknowledged)} acknowledged, all delivered; {load.failed} calls failed")
        assert sum(n - 1 for n in drain.deliveries.values()) == 0
    finally:
        load.stop()


def test_the_workers_end_with_a_killed_supervisor_and_free_the_port(suite, keyspace):
    port = free_port()
    s = ServiceProcess("enqueue", service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target, MAILQUEUE_WORKERS="2",
                                              MAILQUEUE_HEALTH_PORT=str(port)))
    try:
        wait_until(lambda: len(children(s.pid)) == 2, 30, what="two workers")
        pids = children(s.pid)
        s.kill9()
        wait_until(lambda: not any(alive(p) for p in pids), 30, what="the workers ended")
        # Nothing listens on the ports any more: a plain socket binds them again.
        for bound in (s.port, port):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections in TIME_WAIT are no listener
                sock.bind(("127.0.0.1", bound))
                sock.listen()
    finally:
        s.stop()

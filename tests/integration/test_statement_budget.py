"""Cassandra requests per mail on each enqueue path and on a batched Dequeue, counted, not timed: a
path that starts sending more statements per mail than its budget fails here, whatever the
machine's speed.

The counts come from the service's own /metrics (mailqueue_cassandra_statements_total, by kind:
services/adapters/cassandra/statement_kinds.py), read before and after the path's mails, on the
process suite (the services as processes; counter updates written at once, MAILQUEUE_COUNTER_FLUSH_S=0,
so they are counted per mail here where production gathers them).

Unary calls go one at a time: each is a group of its own (services/app/enqueue_group.py), the most a
mail can cost. EnqueueMany and EnqueueBatches send every mail before reading an answer, so the
server groups them (the batches' budget is what grouping saves; a change that stops it fails).
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid

import pytest

from mailqueue.v1 import admin_pb2, enqueue_pb2
from stack.harness import drop_queues
from tests.integration.helpers import simple_mail

#: Kinds a process sends on a timer or a cache's expiry, not per mail: the enqueue members'
#: heartbeat (quota_keeper.py), the shaping members' heartbeat and read, the driver's health
#: probe, and the per-queue cached reads (queue_state.py: the queue, its view configuration, its
#: browse start). Each is bounded per second, not per mail (CACHED_PER_S); any other kind is the mail's.
TIMED = frozenset({
    "insert enqueuers_v1", "insert traffic_shaping_v1", "select traffic_shaping_v1", "select local",
    "select browse_start_v1", "select queues_v1", "select queue_view_config_events_v1",
})
#: At most this many of each timed kind per second of the measurement (they come about once a
#: second each; a cache that stopped caching sends one per mail: tens a second here).
CACHED_PER_S = 3

#: The budget of each path: Cassandra requests per mail (all kinds but the timed ones and the
#: counter updates). Unary: the content's blob row, the view row, the ENQUEUED event (one batch:
#: the history row and its by-name row). With an idempotency key, the claim (a conditional insert)
#: and its commit. EnqueueStream reads the stored blob back before the row. Grouped, the view
#: rows and events of a group share requests; the blob rows (one partition each) stay one per mail.
BUDGET = {
    "unary": 3.0,
    "unary-key": 5.0,
    "stream": 4.0,
    "many": 1.5,
    "batches": 1.5,
}
#: Queue counter updates: written at once in the tests (two per mail: mails and bytes), gathered
#: in production (MAILQUEUE_COUNTER_FLUSH_S: a few a second per process and queue).
COUNTERS = "update queue_counters_v1"
COUNTER_UPDATES = 2.0
MAILS = {"unary": 20, "unary-key": 20, "stream": 10, "many": 100, "batches": 100}


def statements(port: int) -> dict[str, float]:
    """mailqueue_cassandra_statements_total by kind, from a service's /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {k: float(v) for k, v in re.findall(r'^mailqueue_cassandra_statements_total\{kind="([^"]*)"\} (\S+)$', body, re.M)}


def measured(suite, send, mails: int) -> tuple[dict[str, float], float, float]:
    """(per-mail requests by kind, timed kinds' worst count per second, seconds) of ``send()``."""
    port = suite.enqueue.metrics_port
    before, began = statements(port), time.monotonic()
    send()
    seconds = time.monotonic() - began
    after = statements(port)
    used = {k: after[k] - before.get(k, 0.0) for k in after if after[k] > before.get(k, 0.0)}
    per_mail = {k: n / mails for k, n in used.items() if k not in TIMED}
    timed = max((n for k, n in used.items() if k in TIMED), default=0.0)
    return per_mail, timed / max(seconds, 1.0), seconds


def content(path: str, i: int) -> bytes:
    return f"Subject: {path} {i}\r\n\r\nbody {time.time_ns()}\r\n".encode()  # distinct: no shared blob


def request(queue: str, path: str, i: int, key: str = "") -> enqueue_pb2.EnqueueRequest:
    return enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(f"{path}-{i}"), inline_content=content(path, i),
                                      idempotency_key=key)


def sender(suite, queue: str, path: str, n: int):  # noqa: ANN201 - the path's send()
    stub = suite.enqueue_stub

    def unary() -> None:
        for i in range(n):
            stub.Enqueue(request(queue, path, i, key=f"key-{i}" if path == "unary-key" else ""))

    def stream() -> None:
        for i in range(n):
            header = enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail(f"{path}-{i}"))
            stub.EnqueueStream(iter([enqueue_pb2.EnqueueStreamRequest(header=header),
                                     enqueue_pb2.EnqueueStreamRequest(chunk=content(path, i))]))

    def many() -> None:
        mails = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=request(queue, path, i)) for i in range(n)]
        if path == "many":
            answers = list(stub.EnqueueMany(iter(mails)))
        else:
            batches = [enqueue_pb2.EnqueueBatchesRequest(mails=mails[at:at + 50]) for at in range(0, n, 50)]
            answers = [r for b in stub.EnqueueBatches(iter(batches)) for r in b.results]
        assert sorted(a.sequence for a in answers if a.WhichOneof("result") == "receipt") == list(range(n))

    return {"unary": unary, "unary-key": unary, "stream": stream, "many": many, "batches": many}[path]


@pytest.fixture(scope="module")
def queue(process_suite) -> str:
    """One queue for every path (created once: a queue costs seconds), its cached reads done once
    before counting; its RabbitMQ queues dropped after the module's last test."""
    name = f"q-budget-{uuid.uuid4().hex[:8]}"
    assert process_suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=name)).created
    try:
        process_suite.enqueue_mail(name, "warm")
        yield name
    finally:
        drop_queues([name])


@pytest.mark.parametrize("path", list(BUDGET))
def test_each_enqueue_path_stays_within_its_cassandra_statements_per_mail(process_suite, queue, path):
    s = process_suite
    n = MAILS[path]
    per_mail, timed_per_s, seconds = measured(s, sender(s, queue, path, n), n)
    counters = per_mail.pop(COUNTERS, 0.0)
    total = sum(per_mail.values())
    shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_mail.items()))
    print(f"\n{path}: {total:.2f} Cassandra requests per mail over {n} mails in {seconds:.1f} s ({shown}; and {counters:.2f} counter updates)")
    assert total <= BUDGET[path], f"{path}: {total:.2f} requests per mail over a budget of {BUDGET[path]} ({shown})"
    assert counters <= COUNTER_UPDATES, f"{path}: {counters:.2f} counter updates per mail (budget {COUNTER_UPDATES})"
    assert timed_per_s <= CACHED_PER_S, f"{path}: a timed or cached read came {timed_per_s:.1f} times a second: a cache bypassed?"


#: A batched Dequeue answered SUCCESS by Outcomes messages: per delivered mail, the state read
#: (grouped), the deleted mark (marks of a queue that meet in time share an unlogged batch of at
#: most 8: services/adapters/cassandra/group_commit.py), the hand-out's and the answer's events
#: (a row per write and history key). One request per mark would be 1.0 alone.
DEQUEUE_BUDGET = 0.5
DEQUEUED = 96


def test_a_batched_dequeue_answered_success_stays_within_its_cassandra_statements_per_mail(process_suite, queue):
    from tests.integration.helpers import StreamConsumer, fill

    s = process_suite
    drained = f"{queue}-dq"
    assert s.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=drained)).created
    try:
        names = fill(s, drained, DEQUEUED, prefix="budget")
        port = s.dequeue.metrics_port
        consumer = StreamConsumer(s.dequeue_stub, drained, prefetch=64, max_batch=32)
        before, began, got = statements(port), time.monotonic(), []
        while len(got) < DEQUEUED:
            response = consumer.response(timeout=30)
            batch = [response.delivery] if response.WhichOneof("kind") == "delivery" else list(response.deliveries.deliveries)
            got += [d.mail.mail.name for d in batch]
            consumer.answer_all(batch)
        consumer.close()  # half-closed: the stream ends once every answer read is settled (marked)
        with pytest.raises(EOFError):
            consumer.response(timeout=30)
        assert sorted(got) == sorted(names)
        seconds = time.monotonic() - began
        after = statements(port)
        used = {k: after[k] - before.get(k, 0.0) for k in after if after[k] > before.get(k, 0.0)}
        per_mail = {k: n / DEQUEUED for k, n in used.items() if k not in TIMED and k != COUNTERS}
        total = sum(per_mail.values())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_mail.items()))
        print(f"\ndequeue: {total:.2f} Cassandra requests per mail over {DEQUEUED} mails in {seconds:.1f} s ({shown})")
        assert total <= DEQUEUE_BUDGET, f"dequeue: {total:.2f} requests per mail over a budget of {DEQUEUE_BUDGET} ({shown})"
        assert per_mail.get("batch insert deleted_mails_v1", 0) > 0, f"no deleted marks shared a request ({shown})"
    finally:
        drop_queues([drained])

"""The history written from the event stream (MAILQUEUE_HISTORY_FROM_STREAM=true), through gRPC,
on service processes of a keyspace of their own: the delivering services write no history row,
browse_svc's projector writes every event, and a projector killed with SIGKILL mid-load is taken
over by another replica with nothing missing (services/app/history_projector.py)."""

from __future__ import annotations

import threading
import types

import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, enqueue_pb2_grpc, events_pb2, events_pb2_grpc
from stack.harness import ServiceProcess, drop_keyspace, new_keyspace, service_env, wait_until
from tests.integration.helpers import StreamConsumer, inline, one_event_each, simple_mail

HISTORY_ROWS = "mailqueue_cassandra_statements_total"
STORY = ["ENQUEUED", "HANDED_OUT", "DELIVERED"]


@pytest.fixture(scope="module")
def projected(running_stack):
    keyspace = new_keyspace()
    env = service_env(keyspace, MAILQUEUE_HISTORY_FROM_STREAM="true")
    browse = ServiceProcess("browse", env, metrics=True)  # first: it declares the event stream
    enqueue = ServiceProcess("enqueue", env, metrics=True)
    dequeue = ServiceProcess("dequeue", env, metrics=True)
    s = types.SimpleNamespace(env=env, browse=browse, enqueue=enqueue, dequeue=dequeue)
    yield s
    for p in (s.enqueue, s.dequeue, s.browse):
        p.stop()
    drop_keyspace(keyspace)


def new_queue(s) -> str:
    import uuid

    name = f"q-{uuid.uuid4().hex[:10]}"
    assert admin_pb2_grpc.AdminServiceStub(s.browse.channel()).CreateQueue(admin_pb2.CreateQueueRequest(queue=name)).created
    return name


def story(browse, eid: str) -> list[str]:
    stub = events_pb2_grpc.EventServiceStub(browse.channel())
    events = stub.GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=eid), timeout=30).events
    return [events_pb2.EventType.Name(e.type).removeprefix("EVENT_TYPE_") for e in events]


def enqueue_and_deliver(s, queue: str, n: int) -> list[str]:
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(s.enqueue.channel())
    ids = [enqueue.Enqueue(inline(queue, simple_mail(f"p{i}"))).receipt.enqueue_id for i in range(n)]
    consumer = StreamConsumer(dequeue_stub(s), queue, prefetch=32)
    try:
        for _ in range(n):
            consumer.answer(consumer.next())
        wait_until(lambda: all(story(s.browse, i)[-1:] == ["DELIVERED"] for i in ids), 30, what="every mail's history")
    finally:
        consumer.close()
    return ids


def dequeue_stub(s):
    from mailqueue.v1 import dequeue_pb2_grpc

    return dequeue_pb2_grpc.DequeueServiceStub(s.dequeue.channel())


def history_rows(process) -> float:
    return process.metric(HISTORY_ROWS, kind="insert mail_history_groups_v1")


def test_the_delivering_services_write_no_history_row_and_the_projector_writes_every_event(projected):
    s = projected
    # Given mails enqueued and delivered (SUCCESS) with the history written from the stream
    ids = enqueue_and_deliver(s, new_queue(s), 40)
    # Then each mail's story is whole, in order
    assert {tuple(story(s.browse, i)) for i in ids} == {tuple(STORY)}
    # And enqueue_svc and dequeue_svc wrote no history row: browse_svc's projector wrote them all
    assert history_rows(s.enqueue) == 0 and history_rows(s.dequeue) == 0
    assert history_rows(s.browse) > 0
    assert s.browse.metric("mailqueue_history_projected_events_total") >= 3 * len(ids)
    assert 0 <= s.browse.metric("mailqueue_history_projection_lag_seconds") < 30


def test_a_projector_killed_mid_load_is_taken_over_with_nothing_missing(projected):
    s = projected
    # Given a second browse_svc replica standing by (the first holds the projector's lease)
    standby = ServiceProcess("browse", s.env, metrics=True)
    queue = new_queue(s)
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(s.enqueue.channel())
    ids: list[str] = []
    done = threading.Event()

    def produce() -> None:
        for i in range(400):
            ids.append(enqueue.Enqueue(inline(queue, simple_mail(f"k{i}"))).receipt.enqueue_id)
        done.set()

    consumer = StreamConsumer(dequeue_stub(s), queue, prefetch=64)
    producer = threading.Thread(target=produce, daemon=True)
    try:
        projected_before = s.browse.metric("mailqueue_history_projected_events_total")
        producer.start()
        answered = 0
        # When the projecting replica is killed with SIGKILL while mails flow through
        while answered < 400:
            consumer.answer(consumer.next())
            answered += 1
            if answered == 150:
                wait_until(lambda: s.browse.metric("mailqueue_history_projected_events_total") > projected_before, 30,
                           what="the first replica projecting")
                s.browse.kill9()
        producer.join(60)
        assert done.is_set()
        # Then the standby takes the lease over (one term, 15 s) and every mail's story is whole
        wait_until(lambda: all(story(standby, i)[-1:] == ["DELIVERED"] for i in ids), 90, interval=0.5,
                   what="every mail's history after the takeover")
        assert {tuple(story(standby, i)) for i in ids} == {tuple(STORY)}
        print(f"\nprojector killed mid-load: {len(ids)} mails, the standby wrote "
              f"{standby.metric('mailqueue_history_projected_events_total'):.0f} events")
        one_event_each(types.SimpleNamespace(browse=standby), queue, ids, types=tuple(STORY))
    finally:
        consumer.close()
        standby.stop()

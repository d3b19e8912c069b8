"""Backend outages: enqueue answers UNAVAILABLE, and the mail is never browsable nor delivered later.

These stop a real backend, so they run last (marker `outage`) and always restore it.
"""

import os
import queue as q
import signal
import uuid

import grpc
import pytest

from mailqueue.v1 import enqueue_pb2_grpc
from stack.harness import ROOT, broker_stopped, stack, wait_until
from tests.integration.helpers import StreamConsumer, deleted_reason, inline, message_count, simple_mail, view_rows

pytestmark = pytest.mark.outage


def enqueue_ok(suite, queue, size: int | None = None) -> bool:
    """One probe mail enqueued, as a client retrying it would: with an idempotency key, so a try
    that timed out on this side while the server went on to publish it is not a second mail."""
    try:
        request = inline(queue, simple_mail("probe"), os.urandom(size)) if size else inline(queue, simple_mail("probe"))
        request.idempotency_key = f"probe-{queue}"
        suite.enqueue_stub.Enqueue(request, timeout=10)
        return True
    except grpc.RpcError:
        return False


def test_rabbitmq_down_means_unavailable_and_nothing_delivered_later(suite):
    queue = suite.new_queue()
    with broker_stopped():
        with pytest.raises(grpc.RpcError) as e:
            suite.enqueue_stub.Enqueue(inline(queue, simple_mail("lost")), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "rabbitmq" in e.value.details()
    # The row written before the failed publish is marked deleted: never browsed, never delivered.
    rows = [r for r in view_rows(suite, queue) if r.mail.name == "lost"]
    assert all(deleted_reason(suite, queue, r.enqueue_id) for r in rows)
    wait_until(lambda: enqueue_ok(suite, queue), 60, interval=0.5, what="enqueue to work again after RabbitMQ restart")
    # Only the probe is delivered. The failed mail's message may be in the broker after all (its
    # publish reached the broker as it stopped, its confirm never came back): it is skipped as
    # deleted, never handed out.
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=4)
    try:
        assert c.next().mail.mail.name == "probe"
        with pytest.raises(q.Empty):
            c.next(timeout=2)
    finally:
        c.close()


def stack_pid(component: str) -> int:
    """The PID of a local stack component (stack/stack.sh writes .stack/<component>.pid)."""
    with open(os.path.join(ROOT, ".stack", f"{component}.pid")) as f:
        return int(f.read())


#: Content over MAILQUEUE_SMALL_BLOB_BYTES (64 KiB): it goes to S3, not to the small-blob table.
LARGE = 100_000


def test_minio_down_means_unavailable_for_large_mail_and_nothing_written(suite):
    queue = suite.new_queue()
    os.kill(stack_pid("minio"), signal.SIGKILL)
    try:
        with pytest.raises(grpc.RpcError) as e:
            suite.enqueue_stub.Enqueue(inline(queue, simple_mail("lost"), os.urandom(LARGE)), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert view_rows(suite, queue) == [] and message_count(queue) == 0
        # Small content lives in Cassandra: such mail is still accepted while S3 is down.
        small = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("small"), os.urandom(1000)), timeout=60)
        assert small.receipt.enqueue_id and message_count(queue) == 1
    finally:
        stack("up")
    wait_until(lambda: enqueue_ok(suite, queue, LARGE), 60, interval=0.5, what="enqueue to work again after MinIO restart")
    assert message_count(queue) == 2


def test_with_minio_down_the_services_stay_ready_and_one_started_then_serves_small_mail(suite, keyspace):
    """Small content lives in Cassandra: with S3 down a replica (S3 reached directly, as deployed)
    must keep its readiness (a load balancer would otherwise send it no mail at all), and one
    started during the outage must become ready and enqueue small mail."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from stack.harness import ServiceProcess, service_env

    queue = suite.new_queue()
    running = ServiceProcess("enqueue", service_env(keyspace), metrics=True)
    started = None
    os.kill(stack_pid("minio"), signal.SIGKILL)
    try:
        wait_until(lambda: running.metric("mailqueue_large_blob_store_up") == 0, 60, interval=0.5,
                   what="the service's check to find S3 down")
        health = health_pb2_grpc.HealthStub(running.channel())
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        started = ServiceProcess("enqueue", service_env(keyspace))  # waits until SERVING
        for p in (running, started):
            receipt = enqueue_pb2_grpc.EnqueueServiceStub(p.channel()).Enqueue(
                inline(queue, simple_mail("small"), os.urandom(1000)), timeout=60).receipt
            assert receipt.enqueue_id
        assert message_count(queue) == 2
    finally:
        for p in (running, started):
            if p is not None:
                p.stop()
        stack("up")


def test_cassandra_frozen_means_unavailable_and_nothing_delivered(suite):
    # Given Cassandra frozen (SIGSTOP: it accepts nothing and answers nothing), the view write times out.
    queue = suite.new_queue()
    pid = stack_pid("cassandra")
    keyed = inline(queue, simple_mail("keyed"))
    keyed.idempotency_key = "order-frozen"
    os.kill(pid, signal.SIGSTOP)
    try:
        # With an idempotency key too: its claim (a lightweight transaction) times out, and may land
        # once Cassandra resumes, its release retried in the background after it.
        second = suite.enqueue_stub.Enqueue.future(keyed, timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            suite.enqueue_stub.Enqueue(inline(queue, simple_mail("lost")), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cassandra" in e.value.details()
        assert second.exception() is not None and second.exception().code() == grpc.StatusCode.UNAVAILABLE
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: enqueue_ok(suite, queue), 60, interval=0.5, what="enqueue to work again after Cassandra resumed")
    # A row that landed late is marked deleted; the failed mail was never published.
    lost = [r for r in view_rows(suite, queue) if r.mail.name == "lost"]
    assert all(deleted_reason(suite, queue, r.enqueue_id) for r in lost)
    assert message_count(queue) == 1
    # The client retries its key at once: the claim its failed attempt may have left (release
    # pending, or landing as the retry reads it) is this replica's own failure, taken over or
    # claimed afresh: never "in progress" (ABORTED), which would hold the key up to 30 s.
    codes = []

    def retried() -> bool:
        try:
            suite.enqueue_stub.Enqueue(keyed, timeout=10)
        except grpc.RpcError as e:
            codes.append(e.code())
            return False
        return True

    wait_until(retried, 30, interval=0.1, what="the keyed mail enqueued by its client's retry")
    assert grpc.StatusCode.ABORTED not in codes, codes
    assert message_count(queue) == 2


def test_a_transient_cassandra_error_requeues_the_delivery_instead_of_losing_it(suite):
    from tests.integration.helpers import StreamConsumer, dead_letter_count

    queue = suite.new_queue()
    [eid] = [suite.enqueue_stub.Enqueue(inline(queue, simple_mail("patient"))).receipt.enqueue_id]
    pid = stack_pid("cassandra")
    holder = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    assert holder.next().mail.enqueue_id == eid  # held, unanswered
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    os.kill(pid, signal.SIGSTOP)
    try:
        holder.cancel()  # the mail goes back to the queue and reaches c while Cassandra is frozen
        # The deleted-mark check times out: the delivery is retried, not handed out.
        wait_until(lambda: _retried_on_error(suite, queue) >= 1, 60, interval=0.2, what="a retry after the backend error")
    finally:
        os.kill(pid, signal.SIGCONT)
    d = c.next(timeout=60)
    assert d.mail.enqueue_id == eid
    c.answer(d)
    c.close()
    assert dead_letter_count(queue) == 0
    # The services' driver marked the frozen node down; it reconnects within its policy's 10 s.
    wait_until(lambda: enqueue_ok(suite, queue), 60, interval=0.5, what="enqueue to work again after Cassandra resumed")


def _retried_on_error(suite, queue: str) -> float:
    return suite.metric("dequeue", "mailqueue_delivery_retries_on_error_total", queue=queue)


def test_minio_down_for_longer_than_the_delivery_limit_allows_requeues_dead_letters_nothing(suite):
    # The content read (dequeue_svc -> BlobService.GetBytes -> S3) fails for 8 s and more: the
    # delivery is retried where it is, never returned to the queue. Each return counts towards the
    # quorum queue's delivery limit (20): requeued every 0.5 s, it was dead-lettered within 10 s.
    from tests.integration.helpers import StreamConsumer, dead_letter_count

    queue = suite.new_queue()
    content = b"Subject: patience\r\n\r\n" + os.urandom(LARGE)
    eid = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("patient"), content)).receipt.enqueue_id
    os.kill(stack_pid("minio"), signal.SIGKILL)
    try:
        c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
        wait_until(lambda: _retried_on_error(suite, queue) >= 5, 60, interval=0.2, what="5 retries (0.5+1+2+4+8 s) after S3 errors")
    finally:
        stack("up")
    d = c.next(timeout=60)
    assert d.mail.enqueue_id == eid and d.content == content
    assert not d.redelivered  # never returned to the queue: no delivery spent
    c.answer(d)
    c.close()
    wait_until(lambda: deleted_reason(suite, queue, uuid.UUID(eid)) == "dequeued", 30, what="the mail marked dequeued")
    assert dead_letter_count(queue) == 0


def test_a_get_left_while_s3_is_slow_stalls_no_other_call(suite):
    """A client leaves a blob Get while S3 is slow to send (frozen here): blob_svc closed the S3
    response on its event loop, which waited for the read still running on an S3 thread, so every
    call of the process stalled until S3 answered or the read timed out (30 s)."""
    import threading
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from mailqueue.v1 import blob_pb2

    size, chunk = 48 * 1024 * 1024, 256 * 1024  # far more than the socket buffers hold
    data = os.urandom(size)
    blob_id = suite.blob_stub.Put(blob_pb2.PutRequest(chunk=data[i:i + chunk]) for i in range(0, size, chunk)).blob_id
    call = suite.blob_stub.Get(blob_pb2.GetRequest(blob_id=blob_id), timeout=120)
    got = [len(next(call).chunk)]
    pid = stack_pid("minio")
    os.kill(pid, signal.SIGSTOP)
    try:
        def drain():
            try:
                for r in call:
                    got.append(len(r.chunk))
            except grpc.RpcError:
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        seen = {"count": -1, "since": time.monotonic()}

        def stalled() -> bool:  # no chunk for a second: blob_svc waits on S3's socket
            if len(got) != seen["count"]:
                seen.update(count=len(got), since=time.monotonic())
            return time.monotonic() - seen["since"] > 1.0

        wait_until(stalled, 60, interval=0.1, what="the Get waiting on frozen S3")
        assert sum(got) < size
        call.cancel()
        reader.join(10)
        began = time.monotonic()
        status = health_pb2_grpc.HealthStub(suite.blob.channel()).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING and time.monotonic() - began < 5
    finally:
        os.kill(pid, signal.SIGCONT)
    assert b"".join(r.chunk for r in suite.blob_stub.Get(blob_pb2.GetRequest(blob_id=blob_id), timeout=60)) == data

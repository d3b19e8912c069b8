"""Regression tests for the defects an outside tester found (#13), through gRPC on the real stack."""

import json
import os
import subprocess
import sys
import uuid

import grpc
import pika
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, enqueue_pb2
from services.domain import names
from stack.harness import ROOT, broker_parameters, wait_until
from tests.integration.helpers import (
    StreamConsumer,
    code_of,
    dead_letter_count,
    deleted_reason,
    delivered,
    enqueue_names,
    inline,
    message_count,
    simple_mail,
    view_rows,
)


# ---------------------------------------------------------------- 1. subscribe and leave
def test_a_hundred_streams_that_subscribe_and_leave_spend_no_delivery_and_lose_no_mail(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, [f"m{i}" for i in range(20)])
    for _ in range(100):  # as the docs' grpcurl Dequeue does: subscribe (prefetch 16), then end
        StreamConsumer(suite.dequeue_stub, queue, prefetch=16).close()
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=20)
    got = c.take(20, timeout=10)
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ids)  # every mail, once
    for d in got:
        c.answer(d)
    wait_until(lambda: all(deleted_reason(suite, queue, uuid.UUID(i)) == "dequeued" for i in ids), what="all dequeued")
    c.close()
    assert dead_letter_count(queue) == 0 and message_count(queue) == 0


def test_a_mail_the_broker_dead_letters_by_itself_is_marked(suite):
    # A consumer that dies holding the mail, delivery_limit + 1 times (a raw AMQP consumer stands in
    # for a dequeue_svc killed with SIGKILL: nothing of ours runs when its channel dies).
    limit = suite.dequeue.app.settings.rabbitmq.delivery_limit
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["kills-its-consumers"])
    params = broker_parameters()
    for _ in range(limit + 1):
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        wait_until(lambda: ch.basic_get(names.work_queue(queue), auto_ack=False)[0] is not None, what="the delivery")
        conn.close()  # unacked: returned to the queue, one delivery spent
    wait_until(lambda: dead_letter_count(queue) == 1, what="dead-lettered by the broker")
    wait_until(lambda: deleted_reason(suite, queue, uuid.UUID(eid)) is not None, what="the mark")
    assert deleted_reason(suite, queue, uuid.UUID(eid)) == (
        f"dead-lettered by the broker: delivery limit of {limit} reached (deliveries left unanswered)")
    assert suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 0


# ---------------------------------------------------------------- 2. timestamps the storage cannot hold
@pytest.mark.parametrize("seconds", [-62135596800, 253402300799])  # 0001-01-01, 9999-12-31T23:59:59
def test_an_out_of_range_last_updated_is_refused_and_writes_nothing(suite, seconds):
    queue = suite.new_queue()
    mail = simple_mail("bad-date")
    mail.last_updated.CopyFrom(timestamp_pb2.Timestamp(seconds=seconds, nanos=999999999))
    for call in (lambda: suite.enqueue_stub.Enqueue(inline(queue, mail)),
                 lambda: suite.enqueue_stub.EnqueueStream(iter([enqueue_pb2.EnqueueStreamRequest(
                     header=enqueue_pb2.EnqueueHeader(queue=queue, mail=mail))]))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "mail.last_updated" in e.value.details()
    assert view_rows(suite, queue) == []
    assert suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 0


def test_rows_with_timestamps_python_cannot_hold_are_skipped_and_the_queue_stays_readable(suite):
    queue = suite.new_queue()
    good, bad = enqueue_names(suite, queue, ["good", "bad"])
    rows = {str(r.enqueue_id): r for r in view_rows(suite, queue)}
    # What an older enqueue_svc wrote for 9999-12-31T23:59:59.999999999Z: the driver rounded it to
    # the year 10000, which no Python datetime holds (every read of the partition failed).
    r = rows[bad]
    suite.view.session.execute(
        f"UPDATE {suite.keyspace}.enqueued_mails_v1 SET last_updated = 253402300800000 "
        "WHERE queue_name = %s AND slice_start = %s AND bucket = %s AND enqueued_at = %s AND enqueue_id = %s",
        (queue, r.slice_start, r.bucket, r.enqueued_at, r.enqueue_id))
    assert suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size == 1  # reads the rows
    assert [b.mail.enqueue_id for b in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))] == [good]
    assert code_of(lambda: list(suite.admin_stub.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue)))) == grpc.StatusCode.OK
    assert suite.metric("browse", "mailqueue_view_rows_undecodable_total", queue=queue) >= 3  # skipped, logged, counted at each read


# ---------------------------------------------------------------- 3. precise statuses
def raw_call(channel: grpc.Channel, method: str, kind: str, body: bytes):
    ident = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
    if kind == "unary":
        return lambda: channel.unary_unary(method, **ident)(body, timeout=10)
    if kind == "client-stream":
        return lambda: channel.stream_unary(method, **ident)(iter([body]), timeout=10)
    if kind == "server-stream":
        return lambda: list(channel.unary_stream(method, **ident)(body, timeout=10))
    return lambda: list(channel.stream_stream(method, **ident)(iter([body]), timeout=10))


RPCS = [
    ("enqueue", "/mailqueue.v1.EnqueueService/Enqueue", "unary"),
    ("enqueue", "/mailqueue.v1.EnqueueService/EnqueueStream", "client-stream"),
    ("enqueue", "/mailqueue.v1.EnqueueService/EnqueueMany", "bidi"),
    ("enqueue", "/mailqueue.v1.EnqueueService/EnqueueBatches", "bidi"),
    ("dequeue", "/mailqueue.v1.DequeueService/Dequeue", "bidi"),
    ("browse", "/mailqueue.v1.BrowseService/GetQueue", "unary"),
    ("browse", "/mailqueue.v1.BrowseService/Browse", "server-stream"),
    ("browse", "/mailqueue.v1.AdminService/CreateQueue", "unary"),
    ("browse", "/mailqueue.v1.AdminService/DeleteMails", "server-stream"),
    ("browse", "/mailqueue.v1.AdminService/DeleteQueue", "server-stream"),
    ("browse", "/mailqueue.v1.AdminService/MoveMails", "server-stream"),
    ("browse", "/mailqueue.v1.BrowseService/BrowseDeadLetters", "server-stream"),
    ("browse", "/mailqueue.v1.BrowseService/CountDeadLetters", "unary"),
    ("browse", "/mailqueue.v1.AdminService/RedriveDeadLetters", "server-stream"),
    ("browse", "/mailqueue.v1.AdminService/PurgeDeadLetters", "server-stream"),
    ("browse", "/mailqueue.v1.AdminService/Flush", "unary"),
    ("browse", "/mailqueue.v1.AdminService/UpdateRetryPolicy", "unary"),
    ("blob", "/mailqueue.v1.BlobService/Put", "client-stream"),
    ("blob", "/mailqueue.v1.BlobService/Get", "server-stream"),
    ("blob", "/mailqueue.v1.BlobService/PutBytes", "unary"),
]
GARBAGE = b"\xff\xff\xff\xff\x0f"  # a truncated varint: not a protobuf message


@pytest.mark.parametrize("service,method,kind", RPCS, ids=[m.rsplit("/", 1)[1] for _, m, _ in RPCS])
def test_an_undecodable_request_is_invalid_argument(suite, service, method, kind):
    channel = getattr(suite, service).channel()
    e = pytest.raises(grpc.RpcError, raw_call(channel, method, kind, GARBAGE))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "not a valid protobuf message" in e.value.details()


def test_out_of_range_timestamps_and_durations_are_invalid_argument(suite):
    queue = suite.new_queue()
    too_old = timestamp_pb2.Timestamp(seconds=-62135596800)
    huge = duration_pb2.Duration(seconds=315576000000)
    calls = {
        "Browse enqueued_after": lambda: list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueued_after=too_old))),
        "Enqueue deliver_at": lambda: suite.enqueue_stub.Enqueue(enqueue_pb2.EnqueueRequest(
            queue=queue, mail=simple_mail(), inline_content=b"x", deliver_at=timestamp_pb2.Timestamp(seconds=253402300799))),
        "RepublishNotProcessed older_than": lambda: suite.admin_stub.RepublishNotProcessed(
            admin_pb2.RepublishNotProcessedRequest(queue=queue, older_than=huge)),
        "UpdateConfiguration slice_window": lambda: suite.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(
            configuration=browse_pb2.ViewConfiguration(slice_window=huge, bucket_count=1, update_browse_start_pace=1000))),
        "RepublishNotProcessed malformed": lambda: suite.admin_stub.RepublishNotProcessed(
            admin_pb2.RepublishNotProcessedRequest(queue=queue, older_than=duration_pb2.Duration(seconds=5, nanos=-1))),
    }
    for what, call in calls.items():
        assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT, what


@pytest.mark.parametrize("value", ["demo\n", "a@example.org\n", "ab" * 32 + "\n"])
def test_a_trailing_newline_never_passes_validation(suite, value):
    if "@" in value:
        call = lambda: suite.enqueue_stub.Enqueue(inline(suite.new_queue(), simple_mail(recipients=(value,))))  # noqa: E731
    elif len(value) > 60:
        from mailqueue.v1 import blob_pb2

        call = lambda: suite.blob_stub.Stat(blob_pb2.StatRequest(blob_id=value))  # noqa: E731
    else:
        call = lambda: suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=value), timeout=3)  # noqa: E731
    assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT


# ---------------------------------------------------------------- 4. echoed input is bounded
def test_a_huge_queue_name_is_invalid_argument_with_a_short_message(suite):
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue="x" * 10240))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(e.value.details()) < 400 and "10242 characters" in e.value.details()


@pytest.mark.parametrize("reserved", ["{queue}.dead-letter", "delay.3", "delay.deliver", "delay.unroutable", "alarm-probe"])
def test_a_queue_name_that_is_one_of_the_brokers_own_exchanges_is_refused_and_declares_nothing(suite, reserved):
    """``mailqueue.<name>`` would be another queue's dead-letter exchange, a delay level or the alarm
    probe, declared with another type: the broker refused it (UNAVAILABLE, for ever) after part of
    the new queue's topology was declared."""
    queue = suite.new_queue()
    name = reserved.format(queue=queue)
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=name), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reserved" in e.value.details(), e.value.details()
    assert name not in suite.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues
    conn = pika.BlockingConnection(broker_parameters())
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as absent:
            conn.channel().queue_declare(names.dead_letter_queue(name), passive=True)
        assert absent.value.reply_code == 404  # nothing of its topology was declared
    finally:
        conn.close()
    [eid] = enqueue_names(suite, queue, ["still-delivered"])  # the queue whose exchange it named works
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    assert [d.mail.enqueue_id for d in c.take(1, timeout=10)] == [eid]
    c.close()


# ---------------------------------------------------------------- 6. a republished mail in flight once
def test_republish_while_the_first_copies_are_queued_delivers_each_mail_once(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, [f"m{i}" for i in range(5)])
    republished = suite.admin_stub.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
        queue=queue, older_than=duration_pb2.Duration())).republished
    assert republished == 5
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=16)
    got = c.take(5, timeout=10)
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ids)
    for d in got:
        c.answer(d)
    # Each second copy was dropped (in flight, or already dequeued), not delivered.
    dropped = lambda: sum(suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason=r) for r in ("in-flight", "deleted"))  # noqa: E731
    wait_until(lambda: dropped() == 5, what="the five second copies dropped")
    assert message_count(queue) == 0 and delivered(suite, queue) == 5  # each mail handed out once
    c.close()


# ---------------------------------------------------------------- 7. operations
def test_a_non_numeric_seconds_variable_refuses_start_up_naming_it():
    env = {**os.environ, "MAILQUEUE_SHUTDOWN_GRACE_S": "soon", "MAILQUEUE_METRICS_PORT": "0"}
    r = subprocess.run([sys.executable, "-m", "enqueue_svc"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "MAILQUEUE_SHUTDOWN_GRACE_S='soon' is not a number" in r.stderr
    refusal = json.loads(r.stderr.strip().splitlines()[-1])  # one JSON line, as every other (it was plain text)
    assert refusal["level"] == "critical" and refusal["msg"].startswith("refusing to start: MAILQUEUE_SHUTDOWN_GRACE_S")
    assert "Traceback" not in r.stderr


def test_the_local_rabbitmq_distribution_port_listens_on_loopback_only(running_stack):
    port = int(os.environ.get("MAILQUEUE_RABBITMQ_DIST_PORT", "25672"))
    listening = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, p = local.split(":")
            if state == "0A" and int(p, 16) == port:  # LISTEN
                listening.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    assert listening == ["127.0.0.1"]


def test_services_script_sees_a_killed_unreaped_service_as_gone():
    """stack/services.sh start right after a SIGKILL used to take the zombie for a live service
    (its check is stack/harness.py's alive, through python -m stack.services)."""
    import signal

    from stack import harness

    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", "-m", "blob_svc"])

    def alive() -> bool:
        return harness.alive(proc.pid, "blob")

    try:
        # Once it has exec'd (before, /proc shows this process's command line; the shell version
        # of this check took long enough to start that it never saw that).
        wait_until(alive, what="the stand-in seen as blob_svc")
        os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", what="a zombie")
        assert not alive()  # killed, not yet reaped by its parent: gone
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- content enqueued again after a Delete
def test_content_enqueued_again_after_blob_svc_deleted_it_is_stored_again(process_suite):
    """enqueue_svc stores small inline content itself; a Delete through blob_svc (another process)
    removes it; the same content enqueued a moment later is stored again, so the acknowledged mail
    has its content (before: enqueue_svc skipped the write for 60 s after its own, and the receipt
    named a blob that did not exist)."""
    s = process_suite
    queue = s.new_queue()
    content = f"Subject: again\r\n\r\n{uuid.uuid4()}\r\n".encode()
    first = s.enqueue_receipt(inline(queue, simple_mail("first"), content))
    (blob_id,) = first.blob_ids
    assert s.blob_stub.Delete(blob_pb2.DeleteRequest(blob_id=blob_id)).existed
    second = s.enqueue_receipt(inline(queue, simple_mail("second"), content))
    assert list(second.blob_ids) == [blob_id]
    assert s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=blob_id)).size == len(content)

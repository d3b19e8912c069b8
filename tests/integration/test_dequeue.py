"""DequeueService through gRPC on the real stack: at-least-once, acks on the stream."""

import hashlib
import os
import queue as q
import uuid

import grpc
import pika
import pytest

from mailqueue.v1 import blob_pb2, dequeue_pb2, mail_pb2
from services.domain import names
from services.runtime.settings import rabbitmq_from_env
from stack.harness import broker_parameters, wait_until
from tests.integration.helpers import (
    StreamConsumer,
    _ready,
    consumer_count,
    dead_letter_count,
    deleted_reason,
    delivered,
    enqueue_names,
    inline,
    message_count,
    peek_contents,
    simple_mail,
)


@pytest.fixture
def suite(contract_suite):
    """This module is the dequeue contract suite: each test runs against the services in-process
    and as separate processes (tests/conftest.py contract_suite)."""
    return contract_suite


def consumer(suite, queue, prefetch=16, max_batch=0) -> StreamConsumer:
    return StreamConsumer(suite.dequeue_stub, queue, prefetch, max_batch)


def test_one_consumer_receives_in_fifo_order_with_content(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, [f"m{i}" for i in range(5)], b"Subject: s\r\n\r\nhello")
    c = consumer(suite, queue)
    got = c.take(5)
    assert [d.mail.enqueue_id for d in got] == ids
    assert all(d.content_inline and d.content == b"Subject: s\r\n\r\nhello" for d in got)
    assert not any(d.redelivered for d in got)
    for d in got:
        c.answer(d)
    wait_until(lambda: all(deleted_reason(suite, queue, uuid.UUID(i)) == "dequeued" for i in ids), what="marks")
    c.close()
    assert message_count(queue) == 0


def test_two_deliveries_before_any_ack_and_acks_out_of_order(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, ["a", "b", "c"])
    c = consumer(suite, queue, prefetch=3)
    a, b, d = c.take(3)
    for delivery in (d, a, b):
        c.answer(delivery)
    wait_until(lambda: all(deleted_reason(suite, queue, uuid.UUID(i)) for i in ids), what="all three marked")
    c.close()
    wait_until(lambda: consumer_count(queue) == 0, what="the stream's consumer gone")
    assert message_count(queue) == 0 and dead_letter_count(queue) == 0  # nothing came back


def test_prefetch_bounds_unanswered_deliveries(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["a", "b", "c"])
    before = delivered(suite, queue)
    c = consumer(suite, queue, prefetch=2)
    first, _second = c.take(2)
    wait_until(lambda: message_count(queue) == 1, what="the third held back in the broker by prefetch 2")
    assert delivered(suite, queue) - before == 2
    c.answer(first)
    assert c.next().mail.mail.name == "c"
    c.cancel()


def test_retry_redelivers(suite):
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["again"])
    c = consumer(suite, queue, prefetch=1)
    first = c.next()
    c.answer(first, "RETRY", "try later", retry_after=0)
    second = c.next()
    assert second.mail.enqueue_id == eid and second.redelivered  # a retried mail was delivered before
    assert second.mail.attempts == 1 and second.mail.last_error == "try later"
    assert deleted_reason(suite, queue, uuid.UUID(eid)) is None
    c.answer(second)
    c.close()


def test_an_unacked_delivery_is_not_handed_to_another_consumer_while_its_stream_lives(suite):
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["held"])
    holder, other = consumer(suite, queue, 1), consumer(suite, queue, 1)
    # Either may win the delivery; the other must not see it while the winner's stream lives.
    try:
        got = holder.next(timeout=10)
        winner, waiter = holder, other
    except q.Empty:
        got = other.next(timeout=10)
        winner, waiter = other, holder
    assert got.mail.enqueue_id == eid
    assert message_count(queue) == 0 and delivered(suite, queue) == 1  # held unacked by the winner's channel
    winner.cancel()  # a dropped stream: the delivery goes back to the queue, promptly
    again = waiter.next(timeout=15)
    assert again.mail.enqueue_id == eid and again.redelivered
    waiter.answer(again)
    waiter.close()


def test_deleted_mails_are_never_delivered(suite):
    queue = suite.new_queue()
    gone, live = enqueue_names(suite, queue, ["gone", "live"])
    suite.run(suite.view.mails.mark(queue, uuid.UUID(gone), "deleted"))
    c = consumer(suite, queue)
    assert c.next().mail.enqueue_id == live
    wait_until(lambda: suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason="deleted") == 1,
               what="the deleted one acked away")
    assert delivered(suite, queue) == 1
    c.cancel()
    wait_until(lambda: message_count(queue) == 1, what="the live mail back in the queue")


def test_a_waiting_consumer_wakes_when_a_mail_is_enqueued(suite):
    queue = suite.new_queue()
    c = consumer(suite, queue)
    wait_until(lambda: consumer_count(queue) == 1, what="the stream consuming")
    assert message_count(queue) == 0 and delivered(suite, queue) == 0
    [eid] = enqueue_names(suite, queue, ["late"])
    assert c.next(timeout=10).mail.enqueue_id == eid
    c.cancel()


def test_large_mails_are_delivered_by_blob_reference(suite, aio_loop, keyspace):
    queue = suite.new_queue()
    content = os.urandom(2 * 1024 * 1024)  # above the 1 MiB inline threshold
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("big"), content))
    c = consumer(suite, queue)
    d = c.next()
    assert not d.content_inline and d.content == b"" and d.mail.size == len(content)
    fetched = b"".join(r.chunk for r in suite.blob_stub.Get(blob_pb2.GetRequest(blob_id=d.mail.blob_ids[0])))
    assert fetched == content
    c.answer(d)
    c.close()


def test_reject_dead_letters_and_marks_the_mail(suite):
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["bad"])
    c = consumer(suite, queue)
    c.answer(c.next(), "REJECT", "550 no such user")
    wait_until(lambda: dead_letter_count(queue) == 1, what="dead letter")
    assert deleted_reason(suite, queue, uuid.UUID(eid)) == "dead-lettered: 550 no such user"
    c.close()
    assert message_count(queue) == 0


def test_an_undecodable_message_is_dead_lettered(suite):
    queue = suite.new_queue()
    conn = pika.BlockingConnection(broker_parameters())
    conn.channel().basic_publish(names.exchange(queue), "", b"\xff not a protobuf", pika.BasicProperties(delivery_mode=2))
    conn.close()
    [eid] = enqueue_names(suite, queue, ["fine"])
    c = consumer(suite, queue)
    assert c.next().mail.enqueue_id == eid
    wait_until(lambda: dead_letter_count(queue) == 1, what="poison message dead-lettered")
    c.cancel()


def test_a_missing_blob_dead_letters_a_mail_whose_message_does_not_carry_it(suite):
    queue = suite.new_queue()
    content = os.urandom(100_000)  # over 64 KiB: in S3, read on delivery
    [eid] = enqueue_names(suite, queue, ["orphan"], content)
    assert peek_contents(queue)[0][1] is None
    suite.blob_stub.Delete(blob_pb2.DeleteRequest(blob_id=hashlib.sha256(content).hexdigest()))
    c = consumer(suite, queue)
    wait_until(lambda: dead_letter_count(queue) == 1, what="dead letter")
    assert deleted_reason(suite, queue, uuid.UUID(eid)) == "dead-lettered: content missing"
    assert message_count(queue) == 0
    c.cancel()


def test_a_small_mail_travels_with_its_content_and_its_delivery_reads_no_blob(suite):
    """Small content rides in the message (header + body tail): the delivery needs no blob read,
    so it is delivered even with its blob gone; a RETRY publishes the content along again."""
    queue = suite.new_queue()
    small, large = os.urandom(300), os.urandom(100_000)
    small_id, large_id = (enqueue_names(suite, queue, [n], c)[0] for n, c in (("small", small), ("large", large)))
    carried = {str(m.enqueue_id): c for m, c in peek_contents(queue)}
    assert carried == {small_id: small, large_id: None}
    suite.blob_stub.Delete(blob_pb2.DeleteRequest(blob_id=hashlib.sha256(small).hexdigest()))
    before = {src: inline_contents(suite, queue, src) for src in ("message", "blob_store")}
    c = consumer(suite, queue, prefetch=1)
    first = c.next()
    assert (first.mail.enqueue_id, first.content) == (small_id, small)
    c.answer(first, "RETRY", "later", retry_after=0)
    rest = {}
    for _ in range(2):
        d = c.next()
        rest[d.mail.enqueue_id] = (d.mail.attempts, d.content)
        c.answer(d)
    assert rest == {small_id: (1, small), large_id: (0, large)}
    # Each answer is settled on its own: poll for both marks (the answers are not ordered).
    for eid in (large_id, small_id):
        wait_until(lambda eid=eid: deleted_reason(suite, queue, uuid.UUID(eid)) == "dequeued", what=f"{eid} marked")
    assert {src: inline_contents(suite, queue, src) - n for src, n in before.items()} == {"message": 2, "blob_store": 1}
    c.close()


def inline_contents(suite, queue: str, source: str) -> float:
    """dequeue_svc's mailqueue_delivery_content_total."""
    return suite.metric("dequeue", "mailqueue_delivery_content_total", queue=queue, source=source)


def test_batched_deliveries_respect_prefetch_and_one_outcomes_message_settles_them(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, [f"m{i}" for i in range(7)])
    c = consumer(suite, queue, prefetch=5, max_batch=4)
    assert (c.subscribed.prefetch, c.subscribed.max_batch) == (5, 4)
    over = consumer(suite, suite.new_queue(), prefetch=2, max_batch=32)  # a batch is at most the credit: what is in force is said
    assert (over.subscribed.prefetch, over.subscribed.max_batch) == (2, 2)
    over.close()
    got = []
    while len(got) < 5:  # the first five, in messages of one to four
        r = c.response()
        assert r.WhichOneof("kind") == "deliveries" and 1 <= len(r.deliveries.deliveries) <= 4
        got += r.deliveries.deliveries
    wait_until(lambda: message_count(queue) == 2, what="two left in the broker: prefetch 5 holds them back")
    c.answer_all(got)
    while len(got) < 7:
        got += c.response().deliveries.deliveries
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ids)
    c.answer_all(got[5:])
    wait_until(lambda: all(deleted_reason(suite, queue, uuid.UUID(i)) == "dequeued" for i in ids), what="seven marks")
    c.close()
    assert message_count(queue) == 0


@pytest.mark.parametrize("bad", [
    dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes()),
    "kindless second outcome",
])
def test_a_bad_outcomes_message_ends_the_stream_after_settling_the_answers_before_its_bad_one(suite, bad):
    """Each outcome of an Outcomes message is settled as if sent alone: the SUCCESS before a
    kindless outcome is carried out (it was dropped, and the mail delivered again, while an
    unknown tag in the same place let it through); nothing after it is."""
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, ["a", "b"])
    c = consumer(suite, queue, prefetch=2, max_batch=2)
    got = []
    while len(got) < 2:
        got += c.response().deliveries.deliveries
    settled = []
    if bad == "kindless second outcome":
        bad = dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(
            outcomes=[c.outcome(got[0]), dequeue_pb2.Outcome(delivery_tag=got[1].delivery_tag)]))
        settled = [got[0].mail.enqueue_id]
    c.send(bad)
    with pytest.raises(EOFError):
        c.response(timeout=10)
    assert c.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_until(lambda: message_count(queue) == 2 - len(settled), what="the unsettled deliveries back in the queue")
    assert {i: deleted_reason(suite, queue, uuid.UUID(i)) for i in ids} == {i: "dequeued" if i in settled else None for i in ids}


def test_nothing_is_handed_out_after_an_invalid_answer(suite):
    """The answers before an invalid one free their credit at once: the deliveries that credit let
    through were handed out, and sent, before the stream failed, so no client could answer them
    (an attempt spent each; on a last attempt, dead-lettered as unanswered). Nothing is handed out
    once an answer was refused."""
    queue = suite.new_queue()
    # Three mails of each of two priorities: a consumer per class, each prefetching three, so with
    # a credit of three, three deliveries are prepared and wait for credit.
    for i in range(6):
        request = inline(queue, simple_mail(f"m{i}"))
        request.priority = mail_pb2.PRIORITY_HIGH if i % 2 else mail_pb2.PRIORITY_NORMAL
        suite.enqueue_stub.Enqueue(request)
    c = consumer(suite, queue, prefetch=3, max_batch=1)
    got = [c.response().delivery for _ in range(3)]
    assert all(d.mail.enqueue_id for d in got)
    wait_until(lambda: all(_ready(names.work_queue(queue, p)) == 0 for p in ("high", "normal")),
               what="every message pushed to the stream's consumers")
    c.send(dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(
        outcomes=[*(c.outcome(d) for d in got), dequeue_pb2.Outcome(delivery_tag=got[0].delivery_tag + 10_000,
                                                                   kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)])))
    after = []
    with pytest.raises(EOFError):
        while True:
            r = c.response(timeout=10)
            after += [r.delivery] if r.HasField("delivery") else list(r.deliveries.deliveries)
    assert c.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [d.mail.mail.name for d in after] == []
    # The other three go back unsent, no attempt spent: the next stream gets them as first deliveries
    again = consumer(suite, queue, prefetch=5)
    rest = again.take(3)
    assert sorted(d.mail.mail.name for d in rest) == sorted({f"m{i}" for i in range(6)} - {d.mail.mail.name for d in got})
    assert all(not d.redelivered for d in rest), [(d.mail.mail.name, d.redelivered) for d in rest]
    again.answer_all(rest)
    again.close()


@pytest.mark.parametrize(
    "first, code",
    [
        (dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=1)), grpc.StatusCode.INVALID_ARGUMENT),
        (dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue="no-such-queue")), grpc.StatusCode.NOT_FOUND),
        (dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue="bad/name")), grpc.StatusCode.INVALID_ARGUMENT),
        (dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue="x", prefetch=100000)), grpc.StatusCode.INVALID_ARGUMENT),
        (dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue="x", max_batch=100000)), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_a_bad_subscription_gets_a_precise_status(suite, first, code):
    with pytest.raises(grpc.RpcError) as e:
        list(suite.dequeue_stub.Dequeue(iter([first])))
    assert e.value.code() == code


def test_an_answer_on_the_wrong_stream_settles_nothing_and_ends_that_stream(suite):
    """Each stream's broker channel numbers its deliveries 1, 2, ...: the tags a client sees carry
    a prefix of their stream, so an answer sent on another stream is refused, not taken for that
    stream's delivery of the same number (a SUCCESS for a mail nobody processed)."""
    queue = suite.new_queue()
    a, b = enqueue_names(suite, queue, ["a", "b"])
    one, two = consumer(suite, queue, prefetch=1), consumer(suite, queue, prefetch=1)
    d1, d2 = one.next(), two.next()
    assert {d1.mail.enqueue_id, d2.mail.enqueue_id} == {a, b} and d1.delivery_tag != d2.delivery_tag
    two.send(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=d1.delivery_tag,
                                                                    kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
    with pytest.raises(EOFError):
        two.response(timeout=10)
    assert two.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "was not given out by this stream" in two.error.details()
    wait_until(lambda: message_count(queue) == 1, what="the second stream's delivery back in the queue")
    assert deleted_reason(suite, queue, uuid.UUID(d2.mail.enqueue_id)) is None  # not settled by the stray answer
    one.answer(d1)  # the first stream's delivery is still its own to answer
    wait_until(lambda: deleted_reason(suite, queue, uuid.UUID(d1.mail.enqueue_id)) == "dequeued", what="d1 settled")
    one.close()


def test_an_unknown_delivery_tag_ends_the_stream_and_requeues(suite):
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["m"])
    c = consumer(suite, queue)
    d = c.next()
    c._requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=d.delivery_tag + 1000,
                                                                           kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
    with pytest.raises(EOFError):
        c.next(timeout=10)
    assert c.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_until(lambda: message_count(queue) == 1, what="the unanswered delivery back in the queue")
    assert deleted_reason(suite, queue, uuid.UUID(eid)) is None


def test_a_mail_retried_max_attempts_times_expires_into_the_dead_letter_queue(suite):
    # RETRY no longer spends the broker's delivery limit: the queue's retry policy expires the mail.
    queue = suite.new_queue(initial_backoff=0, max_attempts=3)
    [eid] = enqueue_names(suite, queue, ["poison"])
    c = consumer(suite, queue, prefetch=1)
    for attempt in range(3):
        d = c.next()
        assert d.mail.attempts == attempt
        c.answer(d, "RETRY", "451 try again later")
    wait_until(lambda: dead_letter_count(queue) == 1, what="the expired mail in the dead-letter queue")
    c.cancel()
    assert message_count(queue) == 0
    # Marked, so browse tells it from a mail still queued; the reason names the rule.
    reason = deleted_reason(suite, queue, uuid.UUID(eid))
    assert reason.startswith("expired: 3 attempts over ") and "(max_attempts 3): 451 try again later" in reason


def test_a_mail_whose_streams_keep_breaking_is_dead_lettered_and_marked_at_the_limit(suite):
    # Each broken stream returns the delivery and counts against the limit; the last one is
    # dead-lettered by dequeue_svc (marked), not by RabbitMQ (unmarked, still live to browse).
    limit = rabbitmq_from_env().delivery_limit
    queue = suite.new_queue()
    [eid] = enqueue_names(suite, queue, ["crashes-its-consumers"])
    deliveries = 0
    # Until the broker facts say it is over (in the dead-letter queue), not until a quiet moment:
    # a slow delivery under load must not end the loop early.
    while dead_letter_count(queue) == 0 and deliveries <= limit + 1:
        c = consumer(suite, queue, prefetch=1)
        c.next(timeout=30)
        deliveries += 1
        c.cancel()
        wait_until(lambda: message_count(queue) + dead_letter_count(queue) == 1, what="the delivery returned or dead-lettered")
    assert deliveries == limit + 1
    assert dead_letter_count(queue) == 1 and message_count(queue) == 0
    assert deleted_reason(suite, queue, uuid.UUID(eid)) == f"dead-lettered: delivery limit of {limit} reached, last delivery unanswered"


def enqueue_with_priority(suite, queue, name, priority) -> str:
    from mailqueue.v1 import mail_pb2

    r = inline(queue, simple_mail(name))
    r.priority = getattr(mail_pb2, f"PRIORITY_{priority.upper()}")
    return suite.enqueue_stub.Enqueue(r).receipt.enqueue_id


def test_a_high_priority_mail_overtakes_a_normal_backlog(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, [f"n{i}" for i in range(30)])
    urgent = enqueue_with_priority(suite, queue, "urgent", "high")
    c = consumer(suite, queue, prefetch=1)
    order = []
    for _ in range(31):
        d = c.next()
        order.append(d.mail.enqueue_id)
        c.answer(d)
    c.close()
    assert order.index(urgent) <= 1  # at most the one normal mail already handed out goes first
    wait_until(lambda: all(deleted_reason(suite, queue, uuid.UUID(i)) == "dequeued" for i in order), what="all dequeued")


def test_a_low_priority_mail_is_not_starved_and_classes_keep_their_order(suite):
    queue = suite.new_queue()
    lows = [enqueue_with_priority(suite, queue, f"low{i}", "low") for i in range(3)]
    normals = enqueue_names(suite, queue, [f"n{i}" for i in range(30)])
    c = consumer(suite, queue, prefetch=1)
    order = []
    for _ in range(33):
        d = c.next()
        order.append(d.mail.enqueue_id)
        assert d.mail.priority == (mail_pb2.PRIORITY_LOW if d.mail.enqueue_id in lows else mail_pb2.PRIORITY_NORMAL)
        c.answer(d)
    c.close()
    assert order.index(lows[0]) < 11  # one delivery in ten goes to the waiting lower class
    assert [i for i in order if i in lows] == lows and [i for i in order if i in normals] == normals


def test_an_unknown_priority_is_invalid_argument(suite):
    queue = suite.new_queue()
    r = inline(queue, simple_mail("odd"))
    r.priority = 42
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.Enqueue(r)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "priority 42" in e.value.details()
    assert message_count(queue) == 0


def test_a_batch_of_large_inline_mails_comes_in_messages_a_default_client_receives(suite):
    """max_batch 32 of 600 KB mails (each inline: under MAILQUEUE_DEQUEUE_INLINE_BYTES) is 6 MB
    for 10 mails, 19 MiB for 32: one Deliveries message was refused by a client's default 4 MiB
    receive limit (past 16 MiB, by the server) every time it was sent again, until the broker's
    delivery limit dead-lettered mails no client had seen. Now they come in messages of at most
    4 MiB, each mail once, its content whole; this stream's channel has gRPC's default limits."""
    queue = suite.new_queue()
    content = b"Subject: big\r\n\r\n" + os.urandom(300_000).hex().encode()
    ids = [suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"big-{i}"), content)).receipt.enqueue_id for i in range(10)]
    c = consumer(suite, queue, prefetch=32, max_batch=32)
    got, messages = [], 0
    while len(got) < 10:
        r = c.response(timeout=30)
        assert r.WhichOneof("kind") == "deliveries" and r.ByteSize() <= 4 * 1024 * 1024
        got += list(r.deliveries.deliveries)
        messages += 1
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ids) and messages >= 2
    assert all(d.content_inline and d.content == content for d in got)
    c.answer_all(got)
    c.close()


@pytest.mark.outage  # it cuts every connection of the broker's dequeue user: run with the tests that stop a backend
def test_a_stream_whose_channel_dies_lets_its_mails_go_at_once(suite):
    """The broker closes dequeue_svc's connection while a stream's client has stopped reading (its
    handler is stuck sending): the broker gives that stream's messages back, and another stream of
    the same process gets them. It found them still claimed by the stuck stream and acked each as a
    second copy, leaving the mails without a message until the healer's grace (15 minutes). Now a
    stream whose channel dies lets go of its mails at once, and the other stream gets every one."""
    import queue as pyqueue

    from stack.harness import stack

    queue = suite.new_queue()
    content = b"Subject: big\r\n\r\n" + os.urandom(450_000).hex().encode()  # 900 KB, handed out inline
    ids = {suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}"), content)).receipt.enqueue_id for i in range(24)}
    requests: pyqueue.Queue = pyqueue.Queue()
    requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=24)))
    stuck = suite.dequeue_stub.Dequeue(iter(requests.get, None))  # never read: flow control stops its handler
    try:
        wait_until(lambda: message_count(queue) == 0, 30, what="every message taken by the stream that does not read")
        stack("rabbitmqctl", "-q", "close_all_user_connections", "mailqueue-dequeue", "test: the broker closes the connection")
        other = consumer(suite, queue, prefetch=24)
        got = set()
        while len(got) < len(ids):
            d = other.next(timeout=30)
            got.add(d.mail.enqueue_id)
            other.answer(d)
        assert got == ids
        other.close()
    finally:
        stuck.cancel()
        requests.put(None)

"""#49 item 5: a W3C traceparent given on Enqueue (gRPC metadata) is kept with the mail and handed
to the consumer with each Delivery, through every enqueue RPC, a RETRY and a move; a malformed one
is refused (INVALID_ARGUMENT) and writes nothing."""

from __future__ import annotations

import grpc
import pytest

from mailqueue.v1 import admin_pb2, enqueue_pb2
from tests.integration.helpers import StreamConsumer, inline, simple_mail

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def traced(value: str) -> tuple[tuple[str, str], ...]:
    return (("traceparent", value),)


def drain(suite, queue: str, n: int) -> dict[str, tuple[str, str]]:
    """Every mail of ``queue`` dequeued and answered SUCCESS: name -> (Delivery.traceparent, mail.traceparent)."""
    c = StreamConsumer(suite.dequeue_stub, queue)
    got = {}
    for _ in range(n):
        d = c.next()
        got[d.mail.mail.name] = (d.traceparent, d.mail.traceparent)
        c.answer(d)
    c.close()
    return got


def test_the_traceparent_given_on_enqueue_or_enqueue_stream_is_handed_out_with_the_delivery_and_a_mail_without_one_has_none(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("traced")), metadata=traced(TRACE))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("plain")))

    def streamed():
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail("streamed")))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=b"Subject: s\r\n\r\nstreamed\r\n")

    suite.enqueue_stub.EnqueueStream(streamed(), metadata=traced(OTHER), timeout=60)
    assert drain(suite, queue, 3) == {"traced": (TRACE, TRACE), "plain": ("", ""), "streamed": (OTHER, OTHER)}


def test_every_mail_of_a_batched_call_carries_the_calls_traceparent(suite):
    queue = suite.new_queue()
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"b{i}"))) for i in range(20)]
    results = [r for b in suite.enqueue_stub.EnqueueBatches(iter([enqueue_pb2.EnqueueBatchesRequest(mails=many)]),
                                                            metadata=traced(TRACE), timeout=60) for r in b.results]
    assert all(r.HasField("receipt") for r in results) and len(results) == 20
    stream = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(5)]
    assert len(list(suite.enqueue_stub.EnqueueMany(iter(stream), metadata=traced(OTHER), timeout=60))) == 5
    got = drain(suite, queue, 25)
    assert got == {
        **{f"b{i}": (TRACE, TRACE) for i in range(20)}, **{f"m{i}": (OTHER, OTHER) for i in range(5)}}


def test_the_traceparent_stays_with_the_mail_through_a_retry_and_a_move(suite):
    source, target = suite.new_queue(), suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(source, simple_mail("retried")), metadata=traced(TRACE))
    c = StreamConsumer(suite.dequeue_stub, source)
    first = c.next()
    c.answer(first, "RETRY", "try later", retry_after=0)
    again = c.next()
    assert (again.mail.attempts, again.traceparent) == (1, TRACE)
    c.close()
    # Moved (its view row is read, a new enqueue id landed in the target): the trace goes with it.
    suite.enqueue_stub.Enqueue(inline(source, simple_mail("moved")), metadata=traced(OTHER))
    done = list(suite.admin_stub.MoveMails(admin_pb2.MoveMailsRequest(queue=source, to_queue=target, name="moved"), timeout=60))
    assert (done[-1].moved, done[-1].done) == (1, True)
    assert drain(suite, target, 1) == {"moved": (OTHER, OTHER)}


@pytest.mark.parametrize("bad", [
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # an unknown version
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "garbage",
])
def test_a_malformed_traceparent_is_refused_and_writes_nothing(suite, bad):
    queue = suite.new_queue()
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail("x")), metadata=traced(bad))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "traceparent" in e.value.details()
    many = [enqueue_pb2.EnqueueManyRequest(sequence=0, request=inline(queue, simple_mail("y")))]
    with pytest.raises(grpc.RpcError) as e:
        list(suite.enqueue_stub.EnqueueBatches(iter([enqueue_pb2.EnqueueBatchesRequest(mails=many)]), metadata=traced(bad)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert suite.browsed_names(queue) == [] and suite.size(queue, exact=True) == 0


def test_a_resend_by_idempotency_key_keeps_the_first_sends_event_its_name_and_trace(suite):
    """A resend answered with the earlier enqueue records that enqueue's ENQUEUED event again
    (same id), marked resent: its name and trace context are the mail's as queued, not the resend's."""
    from mailqueue.v1 import events_pb2, events_pb2_grpc

    queue = suite.new_queue()
    first = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("first-name"), key="k-resend"), metadata=traced(TRACE)).receipt
    again = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("other-name"), key="k-resend")).receipt
    assert again.enqueue_id == first.enqueue_id and again.duplicate
    history = events_pb2_grpc.EventServiceStub(suite.browse.channel()).GetMailHistory(
        events_pb2.GetMailHistoryRequest(enqueue_id=first.enqueue_id)).events
    [enqueued] = [e for e in history if e.type == events_pb2.EVENT_TYPE_ENQUEUED]
    assert (enqueued.name, enqueued.traceparent, enqueued.details["resent"]) == ("first-name", TRACE, "true")

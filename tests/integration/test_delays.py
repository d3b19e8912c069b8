"""Delays, retry backoff, expiry and Flush (#14), through gRPC on the real stack.

Absence is proven with broker facts: a superseded copy that the delay ladder hands back is
counted by dequeue_svc's `mailqueue_skipped_total{reason="superseded"}` before the test looks
for a second delivery.
"""

import datetime as dt
import time
import uuid

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2
from services.domain import model
from services.runtime.settings import rabbitmq_from_env
from stack.harness import wait_until
from tests.integration.helpers import (
    StreamConsumer,
    dead_letter_count,
    deleted_reason,
    delivered,
    inline,
    message_count,
    simple_mail,
    view_rows,
)


@pytest.fixture
def suite(contract_suite):
    """This module is the delayed contract suite: each test runs against the services in-process
    and as separate processes (tests/conftest.py contract_suite)."""
    return contract_suite


def delayed(queue, name, seconds: float, recipients=("bob@example.org",)) -> enqueue_pb2.EnqueueRequest:
    r = inline(queue, simple_mail(name, recipients=recipients))
    r.delay.FromTimedelta(dt.timedelta(seconds=seconds))
    return r


def skipped(suite, queue: str, reason: str) -> float:
    """dequeue_svc's mailqueue_skipped_total: deliveries acked without handing them out."""
    return suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason=reason)


def test_a_delayed_mail_is_browsable_at_once_and_delivered_no_earlier_than_deliver_at(suite):
    queue = suite.new_queue()
    eid = suite.enqueue_receipt(delayed(queue, "later", 2)).enqueue_id
    [row] = suite.browsed_mails(queue)
    deliver_at = row.deliver_at.ToDatetime(tzinfo=dt.timezone.utc)
    assert row.enqueue_id == eid and deliver_at - row.enqueued_at.ToDatetime(tzinfo=dt.timezone.utc) == dt.timedelta(seconds=2)
    i = suite.info(queue)
    assert (i.size, i.ready, i.delayed) == (1, 0, 1) and not i.HasField("oldest_ready_age")
    c = StreamConsumer(suite.dequeue_stub, queue)
    d = c.next(timeout=10)
    assert model.utcnow() >= deliver_at  # never early
    assert model.utcnow() - deliver_at < dt.timedelta(seconds=1.5)  # and not much late
    assert d.mail.enqueue_id == eid and d.mail.deliver_at == row.deliver_at
    c.answer(d)
    c.close()


@pytest.mark.parametrize("how", ["negative delay", "deliver_at in the past"])
def test_a_negative_delay_or_a_past_deliver_at_is_immediate(suite, how):
    queue = suite.new_queue()
    r = inline(queue, simple_mail("now"))
    if how == "negative delay":
        r.delay.FromTimedelta(dt.timedelta(seconds=-30))
    else:
        r.deliver_at.FromDatetime(dt.datetime(2020, 1, 1))
    eid = suite.enqueue_receipt(r).enqueue_id
    [row] = suite.browsed_mails(queue)
    assert not row.HasField("deliver_at")
    assert suite.info(queue).ready == 1
    c = StreamConsumer(suite.dequeue_stub, queue)
    assert c.next(timeout=5).mail.enqueue_id == eid
    c.cancel()


def test_a_one_year_delay_is_accepted_browsable_and_counted_as_delayed_beyond_is_refused(suite):
    queue = suite.new_queue()
    r = inline(queue, simple_mail("next-year"))
    r.delay.FromTimedelta(dt.timedelta(days=365))
    eid = suite.enqueue_receipt(r).enqueue_id
    assert [m.enqueue_id for m in suite.browsed_mails(queue, schedule=browse_pb2.SCHEDULE_FILTER_DELAYED)] == [eid]
    assert suite.browsed_mails(queue, schedule=browse_pb2.SCHEDULE_FILTER_READY) == []
    i = suite.info(queue)
    assert (i.ready, i.delayed) == (0, 1)
    for field, value in (("delay", dt.timedelta(days=367)), ("deliver_at", dt.datetime.utcnow() + dt.timedelta(days=400))):
        too_far = inline(queue, simple_mail("too-far"))
        getattr(too_far, field).FromTimedelta(value) if field == "delay" else too_far.deliver_at.FromDatetime(value)
        with pytest.raises(grpc.RpcError) as e:
            suite.enqueue_stub.Enqueue(too_far)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ahead" in e.value.details()
    assert len(view_rows(suite, queue)) == 1  # nothing written for the refused ones


def test_flush_delivers_every_delayed_mail_once_in_browse_order(suite):
    queue = suite.new_queue()
    ready = suite.enqueue_receipt(inline(queue, simple_mail("ready"))).enqueue_id
    later = [suite.enqueue_receipt(delayed(queue, f"d{i}", 3)).enqueue_id for i in range(5)]
    assert suite.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue)).flushed == 5
    assert suite.info(queue).delayed == 0
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    got = []
    for _ in range(6):
        d = c.next(timeout=5)
        got.append(d.mail.enqueue_id)
        c.answer(d)
    assert got == [ready, *later]
    # The copies still in the delay ladder come back after 3 s and are dropped, not delivered.
    wait_until(lambda: skipped(suite, queue, "superseded") + skipped(suite, queue, "deleted") == 5, timeout=15, what="ladder copies dropped")
    assert delivered(suite, queue) == 6  # the six, once each
    c.close()


def test_flush_with_a_condition_moves_only_matching_mails(suite):
    queue = suite.new_queue()
    a = suite.enqueue_receipt(delayed(queue, "a", 3600, recipients=("x@Example.ORG",))).enqueue_id
    suite.enqueue_receipt(delayed(queue, "b", 3600, recipients=("y@example.net",)))
    flush = lambda **kw: suite.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue, **kw)).flushed  # noqa: E731
    assert flush(recipient_domain="example.org") == 1
    assert flush(recipient_domain="example.org") == 0  # already ready
    assert [m.enqueue_id for m in suite.browsed_mails(queue, schedule=browse_pb2.SCHEDULE_FILTER_READY)] == [a]
    assert flush(sender="nobody@example.com") == 0
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue, recipient_domain="a@b"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    c = StreamConsumer(suite.dequeue_stub, queue)
    assert c.next(timeout=5).mail.enqueue_id == a
    c.cancel()


def test_deleted_delayed_mails_among_ready_ones_are_never_delivered(suite):
    queue = suite.new_queue()
    a = suite.enqueue_receipt(inline(queue, simple_mail("a"))).enqueue_id
    suite.enqueue_receipt(delayed(queue, "gone", 1))
    c_id = suite.enqueue_receipt(inline(queue, simple_mail("c"))).enqueue_id
    d_id = suite.enqueue_receipt(delayed(queue, "d", 1)).enqueue_id
    list(suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, name="gone")))
    c = StreamConsumer(suite.dequeue_stub, queue)
    got = [c.next(timeout=5) for _ in range(3)]
    assert [d.mail.enqueue_id for d in got] == [a, c_id, d_id]
    for d in got:
        c.answer(d)
    wait_until(lambda: skipped(suite, queue, "deleted") == 1, timeout=10, what="the deleted mail's signal dropped")
    assert delivered(suite, queue) == 3  # not the deleted one
    c.close()


def test_backoff_progression_then_expiry_by_attempts(suite):
    queue = suite.new_queue(initial_backoff=0.5, multiplier=2, max_backoff=1.5, max_attempts=4)
    [eid] = [suite.enqueue_receipt(inline(queue, simple_mail("flaky"))).enqueue_id]
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    seen, answered = [], None
    for _ in range(4):
        d = c.next(timeout=10)
        now = time.monotonic()
        seen.append((d.mail.attempts, d.mail.last_error, None if answered is None else now - answered))
        answered = time.monotonic()
        c.answer(d, "RETRY", f"451 attempt {d.mail.attempts}")
    assert [(a, e) for a, e, _ in seen] == [(0, ""), (1, "451 attempt 0"), (2, "451 attempt 1"), (3, "451 attempt 2")]
    gaps = [g for _, _, g in seen[1:]]
    # 0.5 s, 1 s, then capped at 1.5 s (rounded up to the ladder's 250 ms; never shorter).
    for gap, wanted in zip(gaps, (0.5, 1.0, 1.5)):
        assert wanted <= gap < wanted + 1.0, gaps
    wait_until(lambda: dead_letter_count(queue) == 1, what="the expired mail dead-lettered")
    assert deleted_reason(suite, queue, uuid.UUID(eid)).startswith("expired: 4 attempts over")
    assert message_count(queue) == 0 and suite.info(queue).size == 0
    c.cancel()


def test_expiry_by_age_lands_in_the_dead_letter_queue_with_the_reason(suite):
    queue = suite.new_queue(initial_backoff=60, max_age=2)
    [eid] = [suite.enqueue_receipt(inline(queue, simple_mail("old"))).enqueue_id]
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    first = c.next(timeout=5)
    c.answer(first, "RETRY", "451 greylisted")  # 60 s of backoff, capped at the mail's max age (2 s)
    second = c.next(timeout=5)
    age = model.utcnow() - first.mail.enqueued_at.ToDatetime(tzinfo=dt.timezone.utc)
    assert dt.timedelta(seconds=2) <= age < dt.timedelta(seconds=4)
    c.answer(second, "RETRY", "451 still greylisted")
    wait_until(lambda: dead_letter_count(queue) == 1, what="the expired mail dead-lettered")
    reason = deleted_reason(suite, queue, uuid.UUID(eid))
    assert reason.startswith("expired: 2 attempts over") and "(max_age 2s): 451 still greylisted" in reason
    c.cancel()


def test_a_delayed_retry_does_not_spend_the_broker_delivery_limit(suite):
    limit = rabbitmq_from_env().delivery_limit
    queue = suite.new_queue(initial_backoff=0, max_attempts=limit + 5)
    [eid] = [suite.enqueue_receipt(inline(queue, simple_mail("patient"))).enqueue_id]
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    for attempt in range(limit + 2):
        d = c.next(timeout=5)
        assert d.mail.attempts == attempt
        c.answer(d, "RETRY" if attempt <= limit else "SUCCESS")
    wait_until(lambda: deleted_reason(suite, queue, uuid.UUID(eid)) == "dequeued", what="delivered past the broker's limit")
    assert dead_letter_count(queue) == 0
    c.close()


def test_update_retry_policy_changes_fields_and_refuses_out_of_range_ones(suite):
    queue = suite.new_queue()
    p = browse_pb2.RetryPolicy(max_attempts=7, max_age=duration_pb2.Duration(seconds=86400))
    got = suite.admin_stub.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(queue=queue, retry_policy=p)).retry_policy
    assert got.max_attempts == 7 and got.max_age.seconds == 86400 and got.initial_backoff.seconds == 60  # unset: kept
    assert suite.info(queue).retry_policy == got
    for bad in (browse_pb2.RetryPolicy(multiplier=0.5), browse_pb2.RetryPolicy(max_attempts=100000),
                browse_pb2.RetryPolicy(max_age=duration_pb2.Duration(seconds=10**11)),
                browse_pb2.RetryPolicy(initial_backoff=duration_pb2.Duration(seconds=7200))):  # above max_backoff 1h
        with pytest.raises(grpc.RpcError) as e:
            suite.admin_stub.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(queue=queue, retry_policy=bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    assert suite.info(queue).retry_policy == got


@pytest.mark.parametrize("field", ["retry_after", "delay"])
def test_out_of_range_durations_are_invalid_argument(suite, field):
    queue = suite.new_queue()
    if field == "delay":
        r = inline(queue, simple_mail("x"))
        r.delay.seconds = 10**11
        with pytest.raises(grpc.RpcError) as e:
            suite.enqueue_stub.Enqueue(r)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return
    suite.enqueue_receipt(inline(queue, simple_mail("x")))
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    d = c.next(timeout=5)
    from mailqueue.v1 import dequeue_pb2

    c._requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
        delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_RETRY, retry_after=duration_pb2.Duration(seconds=10**9))))
    with pytest.raises(EOFError):
        c.next(timeout=10)
    assert c.error.code() == grpc.StatusCode.INVALID_ARGUMENT and "retry_after" in c.error.details()


def test_a_deliver_at_timestamp_is_kept_to_the_millisecond(suite):
    queue = suite.new_queue()
    at = timestamp_pb2.Timestamp()
    at.FromDatetime(dt.datetime.utcnow().replace(microsecond=123000) + dt.timedelta(hours=2))
    r = inline(queue, simple_mail("exact"))
    r.deliver_at.CopyFrom(at)
    suite.enqueue_receipt(r)
    assert suite.browsed_mails(queue)[0].deliver_at == at

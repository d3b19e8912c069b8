"""#47.3: the oldest mail's age and the oldest deliverable mail's age, within 1 s of the truth,
through gRPC (GetQueue from the counters, as `mailq show` and the gauge read it) on the real stack.

They were the age of the start of the mail's slice (1 h wide by default): `mailq show` printed
22.4m for mails 8 s old. Now they are read from the queue's first live mails.
"""

from __future__ import annotations

import datetime as dt
import re

from mailqueue.v1 import browse_pb2
from services.app import ages as ages_module
from stack.harness import wait_until
from tests.integration.helpers import StreamConsumer, inline, simple_mail
from tests.integration.test_cli import mailq

TOLERANCE = dt.timedelta(seconds=1)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def enqueued_at(suite, queue: str, name: str) -> dt.datetime:
    [m] = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, name=name))]
    return m.enqueued_at.ToDatetime(tzinfo=dt.timezone.utc)


def ages(suite, queue: str) -> tuple[browse_pb2.QueueInfo, dt.datetime, dt.datetime]:
    """GetQueue (from the counters), with the instants just before and after the call."""
    before = now()
    info = suite.info(queue)
    return info, before, now()


def within(age, since: dt.datetime, before: dt.datetime, after: dt.datetime) -> bool:
    """``age`` (a Duration) is the age of ``since`` at some instant of the call, within 1 s."""
    got = age.ToTimedelta()
    return before - since - TOLERANCE <= got <= after - since + TOLERANCE


def test_get_queue_reports_the_oldest_mail_and_the_oldest_deliverable_mail_within_a_second(suite):
    # Given a delayed mail, then two ready ones, the first ready one 2 s old,
    queue = suite.new_queue()
    delayed = inline(queue, simple_mail("delayed"))
    delayed.delay.FromTimedelta(dt.timedelta(hours=1))
    suite.enqueue_stub.Enqueue(delayed)
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("ready-1")))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("ready-2")))
    oldest, oldest_ready = enqueued_at(suite, queue, "delayed"), enqueued_at(suite, queue, "ready-1")
    wait_until(lambda: now() - oldest_ready >= dt.timedelta(seconds=2), 5, what="the mails 2 s old")
    # when GetQueue reads the queue's counters,
    info, before, after = ages(suite, queue)
    # then its ages are those of the delayed mail and of the first ready one, within 1 s (not the
    # age of their slice's start), with the sizes.
    assert info.approximate and (info.size, info.ready, info.delayed) == (3, 2, 1)
    assert within(info.oldest_mail_age, oldest, before, after), (info.oldest_mail_age.ToTimedelta(), after - oldest)
    assert within(info.oldest_ready_age, oldest_ready, before, after), (info.oldest_ready_age.ToTimedelta(), after - oldest_ready)
    # And `mailq show` prints them in seconds.
    shown = mailq(suite, "show", queue).stdout
    mail_age = int(re.search(r"oldest mail age\s+(\d+)s", shown).group(1))
    ready_age = int(re.search(r"oldest ready\s+(\d+)s", shown).group(1))
    assert 2 <= ready_age <= mail_age <= int((now() - oldest).total_seconds()) + 1, shown


def test_the_ages_follow_the_head_of_the_queue_as_mails_are_delivered(suite):
    # Given three mails, the first two delivered after a first GetQueue,
    queue = suite.new_queue()
    for name in ("a", "b", "c"):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(name)))
    first = enqueued_at(suite, queue, "a")
    info, before, after = ages(suite, queue)
    assert within(info.oldest_ready_age, first, before, after)
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    for _ in range(2):
        d = consumer.next()
        consumer.answer(d)
    wait_until(lambda: suite.size(queue, exact=True) == 1, 30, what="two mails delivered")
    consumer.close()
    [left] = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))]
    left_at = left.enqueued_at.ToDatetime(tzinfo=dt.timezone.utc)
    # then the ages are those of the one left; once it is gone too, there is none.
    info, before, after = ages(suite, queue)
    assert within(info.oldest_mail_age, left_at, before, after) and within(info.oldest_ready_age, left_at, before, after)
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    consumer.answer(consumer.next())
    wait_until(lambda: suite.size(queue) == 0, 30, what="the last mail delivered and counted")
    consumer.close()
    info = suite.info(queue)
    assert not info.HasField("oldest_mail_age") and not info.HasField("oldest_ready_age")


def test_a_head_scan_reads_on_where_the_last_one_stopped(suite, monkeypatch):
    # (A scan begins at least ages.REWIND, 10 s, before now: here at the oldest live mail at once.)
    monkeypatch.setattr(ages_module, "REWIND", dt.timedelta(0))
    # Given 100 mails of which the first 75 were delivered (unary enqueues: delivered in their order),
    queue = suite.new_queue()
    for i in range(100):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"h-{i:03d}")))
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=75)
    consumer.answer_all(consumer.take(75))
    wait_until(lambda: suite.size(queue, exact=True) == 25, 30, what="75 mails delivered")
    consumer.close()
    rows = lambda: suite.metric("browse", "mailqueue_view_rows_read_total", op="age")  # noqa: E731
    # the first GetQueue reads past the rows of the delivered mails; the next ones read on from
    # the oldest live mail it found.
    r0 = rows()
    first = suite.info(queue).oldest_mail_age.ToTimedelta()
    r1 = rows()
    second = suite.info(queue).oldest_mail_age.ToTimedelta()
    r2 = rows()
    buckets = suite.info(queue).configuration.bucket_count
    print(f"head scan rows: first {r1 - r0:.0f}, then {r2 - r1:.0f} ({buckets} buckets)")
    assert r1 - r0 >= 75 and r2 - r1 <= buckets * 10 + 10
    assert first <= second <= first + dt.timedelta(seconds=5)

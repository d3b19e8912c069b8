"""Cheap size, gauges and shape (#15.3, #15.4), through gRPC on the real stack."""

import datetime as dt
import urllib.request

from mailqueue.v1 import admin_pb2, browse_pb2
from services.domain import counts
from stack.harness import ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, enqueue_names, inline, simple_mail


def rows_read(suite, op: str) -> float:
    """browse_svc's mailqueue_view_rows_read_total for one operation."""
    return suite.metric("browse", "mailqueue_view_rows_read_total", op=op)


def test_size_from_counters_reads_no_mail_row_and_follows_enqueue_delay_and_dequeue(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["a", "b", "c"])
    later = inline(queue, simple_mail("later"))
    later.delay.FromTimedelta(dt.timedelta(hours=1))
    suite.enqueue_stub.Enqueue(later)
    before = rows_read(suite, "size")
    assert suite.size(queue) == 4
    i = suite.info(queue)
    assert (i.size, i.ready, i.delayed, i.held, i.approximate) == (4, 3, 1, 0, True)
    assert i.HasField("oldest_ready_age") and i.oldest_mail_age.ToTimedelta() >= dt.timedelta(0)
    assert rows_read(suite, "size") == before  # not one mail row read
    c = StreamConsumer(suite.dequeue_stub, queue)
    for d in c.take(3):
        c.answer(d)
    wait_until(lambda: suite.size(queue) == 1, what="counters to follow the dequeues")
    assert suite.size(queue, exact=True) == 1 and rows_read(suite, "size") > before
    list(suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, name="later")))
    assert (suite.size(queue), suite.info(queue).delayed) == (0, 0)
    c.close()


def test_reconcile_heals_drifted_counters(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["a", "b"])
    [row] = [r for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, limit=1))]
    # Drift as a lost update would leave it: three mails counted that do not exist, one delayed.
    slice_start = row.mail.slice_start.ToDatetime(tzinfo=dt.timezone.utc)
    suite.run(suite.view.counters.add(queue, "enqueued", slice_start, 3))
    suite.run(suite.view.counters.add(queue, "delayed", slice_start, 1))
    assert suite.size(queue) == 5 and suite.info(queue).delayed == 1
    r = suite.admin_stub.ReconcileCounters(admin_pb2.ReconcileCountersRequest(queue=queue))
    assert (r.size_before, r.delayed_before, r.size_after, r.delayed_after) == (5, 1, 2, 0)
    assert suite.size(queue) == suite.size(queue, exact=True) == 2
    # And the correction is in the audit trail, by the caller
    from mailqueue.v1 import events_pb2
    from tests.integration.helpers import first_queue_event

    e = first_queue_event(suite, queue, events_pb2.EVENT_TYPE_COUNTERS_RECONCILED)
    assert dict(e.details) == {"gone": "+3", "delayed": "-1", "slices": "1"}  # three counted mails ended, one delay


def test_gauges_export_each_queue_state_from_counters_and_a_head_scan(suite, keyspace):
    queue = suite.new_queue(initial_backoff=3600)
    enqueue_names(suite, queue, ["ready-1", "ready-2", "ready-3"])
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    c.answer(c.next(), "REJECT", "550 no such user")
    wait_until(lambda: suite.info(queue).dead_lettered == 1, what="the reject in the dead-letter queue")
    c.answer(c.next(), "RETRY", "451 later")  # delayed by the policy's hour
    wait_until(lambda: suite.info(queue).delayed == 1, what="the retry counted as delayed")
    c.close()
    # A browse_svc process as deployed, its gauges refreshed every second, read from /metrics.
    env = service_env(keyspace, MAILQUEUE_GAUGE_INTERVAL_S="1", MAILQUEUE_BLOB_TARGET=suite.blob.target)
    browse = ServiceProcess("browse", env, metrics=True)
    try:
        state = lambda s: browse.metric("mailqueue_queue_mails", queue=queue, state=s)  # noqa: E731
        wait_until(lambda: (state("ready"), state("delayed"), state("held"), state("dead_lettered")) == (1, 1, 0, 1),
                   what="the gauges")
        # The oldest deliverable age is the ready mail's, exact at the last refresh (1 s ago at most, and
        # within 1 s of the truth): not the age of its slice's start.
        [ready] = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(
            queue=queue, schedule=browse_pb2.SCHEDULE_FILTER_READY))]
        gauge = browse.metric("mailqueue_queue_oldest_deliverable_age_seconds", queue=queue)
        real = (dt.datetime.now(dt.timezone.utc) - ready.enqueued_at.ToDatetime(tzinfo=dt.timezone.utc)).total_seconds()
        assert 0 < gauge and real - 1 - 2 <= gauge <= real + 1, (gauge, real)  # 2 s: the refresh interval and its run
        # The sizes from the counters (no counting pass), the ages from the head of each queue.
        assert browse.metric("mailqueue_view_rows_read_total", op="size") == 0
        assert browse.metric("mailqueue_view_rows_read_total", op="age") > 0
        # A deleted queue's series go with it (left, its age alert would fire until a restart).
        list(suite.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=queue, force=True)))

        def exported() -> list[str]:
            body = urllib.request.urlopen(f"http://127.0.0.1:{browse.metrics_port}/metrics", timeout=5).read().decode()
            return [line for line in body.splitlines() if line.startswith("mailqueue_queue_") and f'queue="{queue}"' in line]

        wait_until(lambda: not exported(), 30, what="the deleted queue's gauges removed")
    finally:
        browse.stop()


def test_counts_summarize_from_browse_start_only():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    h = dt.timedelta(hours=1)
    raw = {"enqueued": {t0: 5, t0 + h: 4}, "gone": {t0: 5, t0 + h: 1}, "delayed": {t0 + h: 2}}
    c = counts.summarize(raw, t0)
    assert (c.size, c.delayed, c.ready, c.oldest_slice, c.oldest_ready_slice) == (3, 2, 1, t0 + h, t0 + h)
    assert counts.summarize(raw, t0 + 2 * h).size == 0


def test_shape_prints_recipient_domains_by_age(suite, tmp_path):
    from tests.integration.test_cli import mailq

    queue = suite.new_queue()
    for i, domain in enumerate(["a.example", "a.example", "b.example"]):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}", recipients=(f"x{i}@{domain}", f"y{i}@A.example"))))
    lines = mailq(suite, "shape", queue).stdout.splitlines()
    assert lines[0].split() == ["T", "5", "10", "20", "40", "80", "160", "320", "640", "1280", "1280+"]
    assert lines[1].split()[:3] == ["TOTAL", "6", "6"]
    assert lines[2].split()[:3] == ["a.example", "5", "5"] and lines[3].split()[:3] == ["b.example", "1", "1"]


def test_reconcile_of_drifted_dead_letter_counters_is_in_the_audit_trail(suite):
    """ReconcileCounters rewrote the dead-letter counters without an event: the one counter
    rewrite an audit of the queue could not see."""
    from mailqueue.v1 import events_pb2
    from tests.integration.helpers import first_queue_event

    queue = suite.new_queue()
    enqueue_names(suite, queue, ["dead"])
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    c.answer(c.next(), "REJECT", "550 no such user")
    c.close()
    counted = lambda: suite.browse_stub.CountDeadLetters(browse_pb2.CountDeadLettersRequest(queue=queue)).total  # noqa: E731
    wait_until(lambda: counted() == 1, what="the dead letter counted")
    suite.run(suite.view.dead_letters.correct(queue, "rejected", 2))  # drift: two more counted than kept
    assert counted() == 3
    suite.admin_stub.ReconcileCounters(admin_pb2.ReconcileCountersRequest(queue=queue))
    assert counted() == 1
    e = first_queue_event(suite, queue, events_pb2.EVENT_TYPE_COUNTERS_RECONCILED)
    assert dict(e.details) == {"dead_letters.rejected": "-2"} and e.actor.kind == events_pb2.ACTOR_KIND_CALLER

"""BrowseService and AdminService through gRPC on the real stack."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import time

import grpc
import pytest
from google.protobuf import duration_pb2

from mailqueue.v1 import admin_pb2, browse_pb2
from services.contract import serde
from services.domain import model, names
from stack.harness import stack, wait_until
from tests.integration.helpers import StreamConsumer, delivered, enqueue_names, inline, message_count, simple_mail, view_rows


@pytest.fixture
def suite(contract_suite):
    """This module is the manageable (browse and admin) contract suite: each test runs against the services in-process
    and as separate processes (tests/conftest.py contract_suite)."""
    return contract_suite


def delete(suite, queue, **condition) -> list[admin_pb2.DeleteProgress]:
    return [r.progress for r in suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, **condition))]


def next_slice(window_s: float = 1.0) -> None:
    """Wait (polling the clock) until a new slice starts."""
    current = int(time.time() // window_s)
    wait_until(lambda: int(time.time() // window_s) > current, 5, interval=0.01, what="next slice")


# ---------------------------------------------------------------- browse and size
def test_browse_returns_live_mails_in_order_with_every_field(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["a", "b", "c"])
    got = suite.browsed(queue, include_content=True)
    assert [r.mail.mail.name for r in got] == ["a", "b", "c"]
    assert all(r.content == b"Subject: x\r\n\r\nbody" for r in got)
    assert [serde.queued_mail_from_proto(r.mail) for r in got] == view_rows(suite, queue)


def test_browse_across_slices_in_order_with_an_empty_slice(fast_suite):
    s = fast_suite
    queue = s.new_queue()
    order = []
    for k in (1, 2, 3, None, 5):  # the 4th slice stays empty
        next_slice()
        if k is not None:
            enqueue_names(s, queue, [f"slice{k}-a", f"slice{k}-b"])
            order += [f"slice{k}-a", f"slice{k}-b"]
    rows = view_rows(s, queue)
    # Four slices at least (two mails of one slice straddle a boundary on a busy machine), with an
    # empty one between the first and the last.
    slices = sorted({r.slice_start for r in rows})
    assert len(slices) >= 4
    assert (slices[-1] - slices[0]).total_seconds() + 1 > len(slices), slices
    assert s.browsed_names(queue) == order
    assert s.size(queue) == 8


def test_browse_filters(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("one", "a@x.org", ("r1@y.org",))))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("two", "", ("r1@y.org", "r2@y.org"))))
    cut = model.utcnow()
    wait_until(lambda: model.utcnow() > cut, what="the clock to move")
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("three", "b@x.org", ("r2@y.org",))))
    assert suite.browsed_names(queue, sender="a@x.org") == ["one"]
    assert suite.browsed_names(queue, sender="<>") == ["two"]
    assert suite.browsed_names(queue, recipient="r2@y.org") == ["two", "three"]
    assert suite.browsed_names(queue, name="three") == ["three"]
    assert suite.browsed_names(queue, limit=2) == ["one", "two"]
    ts = serde.timestamp_to_proto(cut + dt.timedelta(milliseconds=1))
    assert suite.browsed_names(queue, enqueued_after=ts) == ["three"]
    assert suite.browsed_names(queue, enqueued_before=ts) == ["one", "two"]


def test_browse_and_size_skip_dequeued_and_deleted_mails_and_retry_keeps_them(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["keep", "retry", "done", "deleted"])
    assert suite.size(queue) == 4
    delete(suite, queue, name="deleted")
    c = StreamConsumer(suite.dequeue_stub, queue, 8)
    deliveries = {d.mail.mail.name: d for d in c.take(3)}
    c.answer(deliveries["done"], "SUCCESS")
    c.answer(deliveries["retry"], "RETRY", retry_after=0)
    wait_until(lambda: suite.size(queue) == 2, what="size to drop on SUCCESS only")
    assert suite.browsed_names(queue) == ["keep", "retry"]
    c.cancel()


def test_get_queue_describes_the_queue(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, ["old", "new"])
    info = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info
    assert info.queue == queue and info.size == 2
    assert info.configuration.bucket_count >= 1 and info.configuration.slice_window.seconds > 0
    assert info.HasField("browse_start") and info.HasField("content_start")
    assert info.oldest_mail_age.ToTimedelta() >= dt.timedelta(0)
    assert queue in suite.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues


@pytest.mark.parametrize("rpc", ["GetQueue", "GetSize", "Browse"])
def test_unknown_queue_is_not_found(suite, rpc):
    request = {"GetQueue": browse_pb2.GetQueueRequest, "GetSize": browse_pb2.GetSizeRequest,
               "Browse": browse_pb2.BrowseRequest}[rpc](queue="does-not-exist")
    with pytest.raises(grpc.RpcError) as e:
        result = getattr(suite.browse_stub, rpc)(request)
        list(result) if rpc == "Browse" else result
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------- delete and clear
def test_delete_by_name_sender_and_recipient(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("n1", "s1@x.org", ("r1@y.org",))))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("n2", "s2@x.org", ("r1@y.org", "r2@y.org"))))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("n3", "s2@x.org", ("r3@y.org",))))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("n4", "s4@x.org", ("r4@y.org", "r2@y.org"))))
    assert delete(suite, queue, name="n1")[-1].deleted == 1
    assert delete(suite, queue, recipient="r2@y.org")[-1].deleted == 2  # any recipient matches
    assert delete(suite, queue, sender="s2@x.org")[-1].deleted == 1
    assert suite.browsed_names(queue) == []
    assert delete(suite, queue, sender="nobody@x.org")[-1] == admin_pb2.DeleteProgress(scanned=0, deleted=0, done=True)


def test_delete_needs_exactly_one_condition(suite):
    queue = suite.new_queue()
    with pytest.raises(grpc.RpcError) as e:
        delete(suite, queue)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_clear_empties_the_queue_and_deleted_mails_are_not_delivered(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, [f"m{i}" for i in range(5)])
    progress = [r.progress for r in suite.admin_stub.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue))]
    assert progress[-1].done and progress[-1].deleted == 5
    assert suite.size(queue) == 0
    c = StreamConsumer(suite.dequeue_stub, queue)
    wait_until(lambda: suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason="deleted") == 5,
               what="the five deleted mails acked away by dequeue")
    assert message_count(queue) == 0 and delivered(suite, queue) == 0
    c.cancel()


def test_a_delete_does_not_touch_mails_enqueued_after_it_started(suite):
    queue = suite.new_queue()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}", "spam@x.org"))), range(250)))
    stream = suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, sender="spam@x.org"))
    first = next(stream)  # the delete is under way (progress every 100 mails)
    assert not first.progress.done
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("later", "spam@x.org")))
    last = list(stream)[-1].progress
    assert last.done and last.deleted == 250
    assert suite.browsed_names(queue) == ["later"]


def test_concurrent_browse_enqueue_dequeue_delete_and_clear_never_fail(suite):
    queue = suite.new_queue()
    enqueue_names(suite, queue, [f"seed{i}" for i in range(30)])
    errors = []

    def run(fn):
        try:
            for _ in range(5):
                fn()
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    def consume():
        c = StreamConsumer(suite.dequeue_stub, queue, 4)
        import queue as q

        for _ in range(5):
            try:
                c.answer(c.next(timeout=2))
            except q.Empty:
                break
        c.close()

    work = [
        lambda: enqueue_names(suite, queue, ["x"]),
        lambda: suite.browsed(queue),
        lambda: suite.size(queue),
        lambda: delete(suite, queue, name="x"),
        lambda: list(suite.admin_stub.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue))),
        consume,
    ]
    with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
        list(pool.map(run, work))
    assert errors == []


# ---------------------------------------------------------------- configuration
def test_configuration_rules_through_the_admin_service(fast_suite):
    s = fast_suite
    current = s.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
    assert current.slice_window.seconds == 1

    def update(slice_s: int, buckets: int, pace: int):
        return s.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(
            configuration=browse_pb2.ViewConfiguration(
                slice_window=duration_pb2.Duration(seconds=slice_s), bucket_count=buckets, update_browse_start_pace=pace)))

    with pytest.raises(grpc.RpcError) as e:
        update(2, current.bucket_count, 10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "divisor" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        update(1, 0, 10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        s.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert update(1, current.bucket_count, current.update_browse_start_pace).configuration == current  # no change


def test_raising_buckets_keeps_every_mail_browsable(running_stack, aio_loop):
    from stack.harness import new_keyspace
    from tests.conftest import Suite

    s = Suite(aio_loop, new_keyspace(), MAILQUEUE_SLICE_WINDOW_S="2")
    try:
        queue = s.new_queue()
        enqueue_names(s, queue, ["before"])
        config = lambda buckets, window: admin_pb2.UpdateConfigurationRequest(configuration=browse_pb2.ViewConfiguration(  # noqa: E731
            slice_window=duration_pb2.Duration(seconds=window), bucket_count=buckets, update_browse_start_pace=1000))
        s.admin_stub.UpdateConfiguration(config(4, 2))
        for app in s.apps[:-1]:
            app.app.backends().state.forget_config()
        enqueue_names(s, queue, [f"four-buckets-{i}" for i in range(8)])
        assert len({r.bucket for r in view_rows(s, queue)}) > 1
        s.admin_stub.UpdateConfiguration(config(4, 1))  # 1 s divides 2 s
        for app in s.apps[:-1]:
            app.app.backends().state.forget_config()
        enqueue_names(s, queue, ["one-second-slices"])
        assert s.browsed_names(queue) == ["before", *[f"four-buckets-{i}" for i in range(8)], "one-second-slices"]
        with pytest.raises(grpc.RpcError) as e:
            s.admin_stub.UpdateConfiguration(config(2, 1))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "bucket_count may only grow" in e.value.details()
    finally:
        s.stop(drop=True)


# ---------------------------------------------------------------- browse start and republish
def test_browse_start_advances_as_the_queue_drains(fast_suite):
    s = fast_suite
    queue = s.new_queue()
    start = s.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info.browse_start.ToDatetime()
    enqueue_names(s, queue, ["a", "b"])
    next_slice()
    enqueue_names(s, queue, ["c"])
    c = StreamConsumer(s.dequeue_stub, queue)
    for d in c.take(3):
        c.answer(d)
    c.close()
    wait_until(lambda: s.size(queue) == 0, what="the queue to drain")
    next_slice()
    next_slice()
    moved = s.admin_stub.UpdateBrowseStart(admin_pb2.UpdateBrowseStartRequest(queue=queue)).browse_start.ToDatetime()
    assert moved > start
    assert moved <= dt.datetime.utcnow() - dt.timedelta(seconds=1)  # never beyond now - slice window
    from mailqueue.v1 import events_pb2
    from tests.integration.helpers import first_queue_event

    e = first_queue_event(s, queue, events_pb2.EVENT_TYPE_BROWSE_START_MOVED)  # recorded, with where it went
    assert e.details["to"].startswith(moved.isoformat()[:19])
    enqueue_names(s, queue, ["after"])
    assert s.browsed_names(queue) == ["after"]


def test_republish_heals_a_broker_that_lost_its_messages(suite):
    queue = suite.new_queue()
    ids = enqueue_names(suite, queue, [f"m{i}" for i in range(20)])
    stack("rabbitmqctl", "purge_queue", names.work_queue(queue))
    assert message_count(queue) == 0
    r = suite.admin_stub.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
        queue=queue, older_than=duration_pb2.Duration(seconds=0)))
    assert r.republished == 20
    wait_until(lambda: message_count(queue) == 20, what="republished messages")
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=20)
    got = c.take(20)
    for d in got:
        c.answer(d)
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ids)  # each exactly once
    wait_until(lambda: message_count(queue) == 0, what="every copy taken by the stream")
    assert delivered(suite, queue) == 20  # and not one more
    c.close()
    # Answers are settled (marked, counted) after they are sent: wait for the last ones.
    wait_until(lambda: suite.size(queue) == 0, what="the twenty answers settled")


def test_republish_reaches_a_mail_that_kept_an_old_enqueue_time_in_a_recent_slice(suite):
    """A mail moved, or redriven keeping its attempts, keeps its enqueue time but lands in the
    slice of its landing. RepublishNotProcessed stopped at the slice of its cutoff and never
    reached it: its message lost, it stayed undelivered."""
    import dataclasses
    import uuid

    queue = suite.new_queue()
    enqueue_names(suite, queue, ["new"])
    [new] = view_rows(suite, queue)
    # As land() stores a mail moved here, enqueued two hours ago elsewhere: in today's slice.
    old = dataclasses.replace(new, enqueue_id=uuid.uuid1(), enqueued_at=new.enqueued_at - dt.timedelta(hours=2))
    suite.run(suite.view.mails.store(old))
    stack("rabbitmqctl", "purge_queue", names.work_queue(queue))  # the broker lost both messages
    r = suite.admin_stub.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
        queue=queue, older_than=duration_pb2.Duration(seconds=3600)))
    assert r.republished == 1  # the old one, not the new one
    wait_until(lambda: message_count(queue) == 1, what="the old mail's message")
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=4)
    assert c.next().mail.enqueue_id == str(old.enqueue_id)
    c.close()


def test_configuration_changes_at_once_record_one_event_per_change_made(aio_loop, running_stack):
    """Six UpdateConfiguration calls at once, each growing the bucket count to its own number: the
    ones checked against a configuration another then replaced are refused (it may only grow), and
    only the changes made are in the audit trail. A refused one recorded its event too, checked
    against the configuration read before the others wrote."""
    import threading

    from mailqueue.v1 import events_pb2, events_pb2_grpc
    from stack.harness import new_keyspace
    from tests.conftest import Suite

    s = Suite(aio_loop, new_keyspace())  # its own keyspace: a bucket count never comes down again
    try:
        config = s.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
        start, answers = threading.Barrier(6), {}

        def update(count: int) -> None:
            wanted = browse_pb2.ViewConfiguration()
            wanted.CopyFrom(config)
            wanted.bucket_count = count
            start.wait()
            try:
                s.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=wanted))
                answers[count] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                answers[count] = e.code()

        threads = [threading.Thread(target=update, args=(n,)) for n in range(2, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        made = sorted(n for n, code in answers.items() if code == grpc.StatusCode.OK)
        assert made and set(answers.values()) <= {grpc.StatusCode.OK, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED}
        wanted = s.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
        wanted.update_browse_start_pace += 1  # a last change: the end of what to read
        s.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=wanted))
        recorded = []
        watch = events_pb2_grpc.EventServiceStub(s.browse.channel()).WatchEvents(
            events_pb2.WatchEventsRequest(from_oldest=True, types=[events_pb2.EVENT_TYPE_CONFIG_CHANGED]), timeout=30)
        for r in watch:
            if "update_browse_start_pace" in r.event.details:
                watch.cancel()
                break
            if "bucket_count" in r.event.details:
                recorded.append(int(r.event.details["bucket_count"]))
        assert sorted(recorded) == made, answers
    finally:
        s.stop(drop=True)

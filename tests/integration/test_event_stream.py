"""The event stream through gRPC (EventService.WatchEvents on browse_svc) on the real RabbitMQ
stream: events published by the stream's sink (the EventLog's) come back in order with their
cursors; a watcher that leaves mid-burst and resumes from its last cursor gets that event again
and every one after it; filters apply on the server; a bad cursor is INVALID_ARGUMENT; a watcher
that leaves ends its consumer; the stream is declared with its retention."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import uuid

import grpc
import pika
import pytest

from mailqueue.v1 import events_pb2, events_pb2_grpc
from services.domain import names
from services.domain.events import Actor, EventType, event_id, of_queue
from services.domain.events import Event as DomainEvent
from stack.harness import new_keyspace, service_env, stack, wait_until
from tests.conftest import own_queue
from tests.inprocess import RunningApp

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def browse(aio_loop, keyspace):
    """browse_svc alone (it serves EventService), on the session's keyspace (its event stream is
    deleted with the keyspace)."""
    from browse_svc.app import BrowseApp

    app = RunningApp(aio_loop, BrowseApp, "browse", service_env(keyspace))
    yield app
    app.stop()


@pytest.fixture(scope="module")
def stub(browse):
    channel = browse.channel()
    yield events_pb2_grpc.EventServiceStub(channel)
    channel.close()


def events(queue: str, n: int, kind: EventType = EventType.ENQUEUED, start: int = 0) -> list[DomainEvent]:
    """``n`` events of one queue (distinct ids), as the EventLog records them."""
    out = []
    for i in range(start, start + n):
        e = of_queue(kind, queue, f"test-{i}", details={"i": str(i)}, replica="test", actor=Actor("caller", "admin", "test"))
        out.append(dataclasses.replace(e, id=event_id(kind, queue, uuid.UUID(int=i + 1), i)))
    return out


def publish(browse, batch: list[DomainEvent]) -> None:
    browse.loop.run(browse.app.backends().stream.publish(batch))


def watch(stub, **request) -> grpc.Call:
    return stub.WatchEvents(events_pb2.WatchEventsRequest(**request), timeout=30)


def take(call, n: int) -> list[events_pb2.Event]:
    return [next(call).event for _ in range(n)]


def test_resume_from_the_last_cursor_after_leaving_mid_burst_misses_nothing(browse, stub):
    queue = own_queue("ev")
    sent = events(queue, 600)
    first = watch(stub, from_oldest=True, queues=[queue])
    publish(browse, sent[:50])
    head = take(first, 50)
    assert [e.id for e in head] == [e.id for e in sent[:50]]
    # The rest is published in batches while the watcher reads, and it leaves in the middle.
    burst = threading.Thread(target=lambda: [publish(browse, sent[i:i + 50]) for i in range(50, 600, 50)])
    burst.start()
    seen = head + take(first, 130)
    first.cancel()
    burst.join(30)
    assert [e.id for e in seen] == [e.id for e in sent[:180]]
    cursors = [int(e.cursor) for e in seen]
    assert cursors == sorted(cursors) and len(set(cursors)) == 180
    last = seen[-1]

    resumed = watch(stub, cursor=last.cursor, queues=[queue])
    again = take(resumed, 600 - 179)
    resumed.cancel()
    assert again[0].id == last.id and again[0].cursor == last.cursor  # the cursor's event again
    assert [e.id for e in again[1:]] == [e.id for e in sent[180:]]  # then every later one, once
    got = again[0]
    assert (got.queue, got.type, got.replica, got.details["i"]) == (queue, events_pb2.EVENT_TYPE_ENQUEUED, "test", "179")
    assert (got.actor.kind, got.actor.role, got.actor.identity) == (events_pb2.ACTOR_KIND_CALLER, "admin", "test")


def test_filters_apply_on_the_server(browse, stub):
    q1, q2 = (own_queue("ev") for _ in range(2))
    before = take(watch(stub, from_oldest=True), 1)  # any event: its cursor is before this test's
    publish(browse, events(q1, 20) + events(q2, 20) + events(q1, 5, EventType.DELIVERED, 100) + events(q2, 5, EventType.DELIVERED, 200))
    sentinel = events(q1, 1, EventType.DELIVERED, 300)
    publish(browse, sentinel)
    call = watch(stub, cursor=before[0].cursor, queues=[q1], types=[events_pb2.EVENT_TYPE_DELIVERED])
    got = []
    while not got or got[-1].id != sentinel[0].id:
        got.append(next(call).event)
    call.cancel()
    assert [e.details["i"] for e in got] == ["100", "101", "102", "103", "104", "300"]
    assert {(e.queue, e.type) for e in got} == {(q1, events_pb2.EVENT_TYPE_DELIVERED)}


@pytest.mark.parametrize("request_fields", [
    {"cursor": "abc"}, {"cursor": "-1"}, {"cursor": "1.5"}, {"cursor": "99999999999999999999"}, {"cursor": " 7"},
    {"types": [999]}, {"types": [events_pb2.EVENT_TYPE_UNSPECIFIED]},
    # a queue filter no queue can match (it matched nothing, silently, until the deadline)
    {"queues": ["!!bad"]}, {"queues": ["ok", "a b"]}, {"queues": ["q" * 101]},
])
def test_a_malformed_cursor_type_or_queue_is_invalid_argument(stub, request_fields):
    with pytest.raises(grpc.RpcError) as e:
        next(watch(stub, **request_fields))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()


def rpcs(code: str) -> float:
    from prometheus_client import REGISTRY  # browse_svc runs in this process

    return sum(s.value for m in REGISTRY.collect() for s in m.samples
               if s.name == "mailqueue_rpc_total" and s.labels.get("method") == "WatchEvents" and s.labels.get("code") == code)


def test_a_watch_that_leaves_or_runs_out_of_time_is_counted_so_not_ok(browse, stub):
    """mailqueue_rpc_total{code}: a watcher's cancel is CANCELLED and a deadline DEADLINE_EXCEEDED,
    as its client saw them (they were counted OK)."""
    publish(browse, events(own_queue("ev"), 1))  # an event for each watch from the oldest to get
    before = {c: rpcs(c) for c in ("OK", "CANCELLED", "DEADLINE_EXCEEDED")}
    for _ in range(3):
        call = watch(stub, from_oldest=True)
        next(call)
        call.cancel()
    late = stub.WatchEvents(events_pb2.WatchEventsRequest(), timeout=0.5)  # at the next event: none comes
    with pytest.raises(grpc.RpcError) as e:
        next(late)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: rpcs("CANCELLED") - before["CANCELLED"] == 3 and rpcs("DEADLINE_EXCEEDED") - before["DEADLINE_EXCEEDED"] == 1,
               timeout=10, what="3 watches counted CANCELLED and 1 DEADLINE_EXCEEDED")
    assert rpcs("OK") == before["OK"]


def test_a_service_that_may_not_declare_publishes_only_once_the_stream_exists(aio_loop, running_stack):
    """dequeue_svc's RabbitMQ user may not declare: before browse_svc declared the stream, its
    events are UNAVAILABLE (its change is not acknowledged) and nothing is published to a missing
    exchange, which would close the confirm channel its mails share; once declared, they go."""
    from services.adapters.rabbitmq.broker import RabbitMQBroker
    from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
    from services.domain.errors import BackendUnavailable
    from services.runtime.settings import rabbitmq_from_env
    from stack.harness import as_service, drop_event_stream

    keyspace = new_keyspace()
    settings = {role: rabbitmq_from_env(as_service(role, dict(os.environ))) for role in ("dequeue", "browse")}
    brokers = {role: RabbitMQBroker(s, keyspace) for role, s in settings.items()}
    streams = {role: RabbitMQEventStream(brokers[role], keyspace, settings[role]) for role in brokers}
    try:
        with pytest.raises(BackendUnavailable, match="is not declared yet"):
            aio_loop.run(streams["dequeue"].publish(events("q", 1)))
        aio_loop.run(streams["browse"].declare())
        aio_loop.run(streams["dequeue"].publish(events("q", 3)))  # the same broker and confirm channel
    finally:
        for b in brokers.values():
            aio_loop.run(b.close())
        drop_event_stream(keyspace)


def stream_row(stream: str) -> dict:
    """The stream as the broker lists it (rabbitmqctl: a passive declare counts no stream consumers)."""
    out = stack("rabbitmqctl", "-q", "list_queues", "name", "type", "arguments", "consumers", "--formatter", "json").stdout
    (row,) = [r for r in json.loads(out) if r["name"] == stream]
    return row


def test_a_cursor_past_the_end_of_the_stream_is_out_of_range(browse, stub):
    """A cursor after the stream's last message (a stream deleted and declared again since the
    cursor was given: its offsets start at 0 again) is OUT_OF_RANGE, within a few seconds; it
    used to wait, silently skipping every event until the offsets reached the cursor's. The
    stream's last event's own cursor is in range."""
    import time

    from services.domain import event_stream

    queue = own_queue("ev")
    publish(browse, events(queue, 1))
    last = next(watch(stub, from_oldest=True, queues=[queue])).event.cursor
    at = event_stream.start(last).offset
    for past in (at + 1, at + 1000, 2**40):
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            next(watch(stub, cursor=event_stream.cursor_of(past)))
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE and "from_oldest" in e.value.details(), e.value.details()
        assert time.monotonic() - began < 10
    call = watch(stub, cursor=last, queues=[queue])
    assert next(call).event.cursor == last
    call.cancel()


def test_a_cursor_past_the_end_of_a_busy_stream_is_out_of_range_too(browse, stub):
    """While events keep coming (a message every 50 ms: the stream's consumer never idles), a
    cursor past the end is still OUT_OF_RANGE, once the messages read are newer than the watch;
    the probe used to follow the new traffic until the offsets reached the cursor. mailq events
    given such a cursor says why and what to run, and offers no cursor to go on from."""
    import pathlib
    import subprocess
    import sys
    import tempfile
    import time

    from services.domain import event_stream

    queue = own_queue("ev")
    publish(browse, events(queue, 1))
    at = event_stream.start(next(watch(stub, from_oldest=True, queues=[queue])).event.cursor).offset
    past = event_stream.cursor_of(at + 100_000)
    stop = threading.Event()

    def busy() -> None:
        i = 1
        while not stop.is_set():
            publish(browse, events(queue, 1, start=i))
            i += 1
            stop.wait(0.05)

    publisher = threading.Thread(target=busy, daemon=True)
    publisher.start()
    try:
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            next(watch(stub, cursor=past))
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE, e.value.details()
        assert time.monotonic() - began < 20
        mailq = pathlib.Path(sys.executable).parent / "mailq"
        r = subprocess.run([str(mailq), "--browse", browse.target, "events", "--cursor", past, "--count", "1"],
                           cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "past the end of the event stream" in r.stderr and "mailq events --oldest" in r.stderr
        assert "to go on" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        stop.set()
        publisher.join(10)


def consuming_channels() -> set[tuple[str, int]]:
    """The broker's channels that hold a consumer, as (connection, channel number). Not by
    consumer tag: rabbitmqctl list_consumers leaves out the consumers of stream queues."""
    out = stack("rabbitmqctl", "-q", "list_channels", "connection", "number", "consumer_count", "--formatter", "json").stdout
    return {(r["connection"], r["number"]) for r in json.loads(out) if r["consumer_count"]}


def test_a_watcher_that_leaves_ends_its_consumer(browse, stub):
    """Each watcher consumes on a channel of its own: the three watchers' channels appear, and
    are gone once they leave. Told apart from the channels that held consumers before (the
    session's keyspace is shared: another module's webhook_svc may still be ending its own), and
    the stream's own count of consumers goes back to what it was."""
    stream = names.event_stream(browse.app.settings.cassandra.keyspace)
    before, counted = consuming_channels(), stream_row(stream)["consumers"]
    calls = [watch(stub) for _ in range(3)]
    wait_until(lambda: len(consuming_channels() - before) >= 3, 30, what="the three watchers' channels")
    theirs = consuming_channels() - before
    assert stream_row(stream)["consumers"] >= counted + 3 - len(before - consuming_channels())
    for c in calls:
        c.cancel()
    wait_until(lambda: not consuming_channels() & theirs, 30, what="the channels of the watchers that left closed")
    wait_until(lambda: stream_row(stream)["consumers"] <= counted, 30, what="the stream's consumers back to what they were")


def test_the_stream_is_declared_with_its_retention(browse):
    row = stream_row(names.event_stream(browse.app.settings.cassandra.keyspace))
    args = {key: value for key, _type, value in row["arguments"]}
    s = browse.app.settings.rabbitmq
    assert row["type"] == "stream" and args["x-queue-type"] == "stream"
    assert args["x-max-age"] == f"{s.event_stream_retention_s}s" == "604800s"
    assert args["x-max-length-bytes"] == s.event_stream_max_bytes == 5 * 1024**3
    assert args["x-stream-max-segment-size-bytes"] == 500 * 1024**2


def test_a_stream_deleted_under_a_watcher_is_unavailable_and_declared_again_by_the_next_publish(browse, stub):
    """An operator (or a broker reset) removes the stream: its watchers end UNAVAILABLE (they resume
    from their last cursor), a publish fails UNAVAILABLE (its change is not acknowledged), and the
    next one declares the stream again. Last of the module: RabbitMQ 3.10 keeps counting, on a
    stream declared again, the consumers of the one deleted (list_queues), which would blind the
    consumer count above."""
    from services.domain.errors import BackendUnavailable
    from stack.harness import broker_parameters

    queue = own_queue("ev")
    stream = names.event_stream(browse.app.settings.cassandra.keyspace)
    call = watch(stub, from_oldest=True, queues=[queue])
    publish(browse, events(queue, 1))
    publish(browse, events(queue, 1, start=10))  # a message at offset 1 at least
    assert next(call).event.queue == queue
    before = next(call).event.cursor
    with pika.BlockingConnection(broker_parameters()) as conn:
        conn.channel().queue_delete(stream)
    with pytest.raises(grpc.RpcError) as e:
        next(call)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
    with pytest.raises(BackendUnavailable, match="rabbitmq unavailable"):
        publish(browse, events(queue, 1, start=1))
    publish(browse, events(queue, 1, start=2))
    again = watch(stub, from_oldest=True, queues=[queue])
    assert next(again).event.details["i"] == "2"  # the new stream holds what was published since
    again.cancel()
    with pytest.raises(grpc.RpcError) as e:  # a cursor of the stream deleted: past the new one's end
        next(watch(stub, cursor=before))
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE, e.value.details()


class Watcher:
    """A WatchEvents call read in a thread: its events, then how it ended (None: still open)."""

    def __init__(self, stub, **request) -> None:
        self.call = stub.WatchEvents(events_pb2.WatchEventsRequest(**request), timeout=120)
        self.events: list[events_pb2.Event] = []
        self.ended: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for answer in self.call:
                self.events.append(answer.event)
        except grpc.RpcError as e:
            self.ended = e


def test_a_watcher_resumes_from_its_cursor_across_a_sigkill_and_restart_of_browse_svc(suite, keyspace):
    """Mails enqueued (enqueue_svc records their events) while the browse_svc process a watcher
    follows is killed mid-burst and started again: resumed from its last cursor, the watcher gets
    that event again, then every later one, each once: every acknowledged enqueue is there."""
    from concurrent.futures import ThreadPoolExecutor

    from stack.harness import ServiceProcess, service_env
    from tests.integration.helpers import inline, simple_mail

    queue = suite.new_queue()
    browse = ServiceProcess("browse", service_env(keyspace))
    try:
        stub = events_pb2_grpc.EventServiceStub(browse.channel())
        only = {"queues": [queue], "types": [events_pb2.EVENT_TYPE_ENQUEUED]}
        first = Watcher(stub, **only)  # from the next event recorded: probe until it reads one

        def reading() -> bool:
            if not first.events:
                suite.enqueue_stub.Enqueue(inline(queue, simple_mail("probe")))
            return bool(first.events)

        wait_until(reading, 30, interval=0.2, what="the watcher reading")
        acked: list[str] = []

        def enqueue(i: int) -> None:
            acked.append(suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}")), timeout=30).receipt.enqueue_id)

        with ThreadPoolExecutor(8) as pool:
            burst = [pool.submit(enqueue, i) for i in range(200)]
            wait_until(lambda: len(first.events) >= 50, 60, what="50 events read before the kill")
            browse.kill9()
            first.thread.join(30)
            assert first.ended is not None and first.ended.code() == grpc.StatusCode.UNAVAILABLE, first.ended
            killed_at, last = len(acked), first.events[-1]
            browse.start()
            second = Watcher(events_pb2_grpc.EventServiceStub(browse.channel()), cursor=last.cursor, **only)
            for f in burst:
                f.result()
        assert killed_at < len(acked)  # the burst went on while browse_svc was down
        wait_until(lambda: {e.enqueue_id for e in second.events} >= set(acked) - {e.enqueue_id for e in first.events},
                   60, what="every acknowledged enqueue after the cursor")
        second.call.cancel()
        seen = first.events + second.events[1:]
        assert second.events[0].id == last.id and second.events[0].cursor == last.cursor
        assert len({e.id for e in seen}) == len(seen), "an event twice past the resume point"
        assert set(acked) <= {e.enqueue_id for e in seen}
        cursors = [int(e.cursor) for e in seen]
        assert cursors == sorted(cursors)
    finally:
        browse.stop()


def test_mailq_events_goes_on_by_itself_when_its_stream_is_cut(suite, keyspace):
    """`mailq events` follows a browse_svc process that is killed and started again (as the
    server's connection age, a rolling update or a crash cuts every stream): it resumes after the
    last event it showed, and shows every later event once."""
    import pathlib
    import subprocess
    import sys
    import tempfile

    from stack.harness import ServiceProcess, service_env
    from tests.integration.helpers import inline, simple_mail

    queue = suite.new_queue()
    browse = ServiceProcess("browse", service_env(keyspace))
    mailq = pathlib.Path(sys.executable).parent / "mailq"
    follower = subprocess.Popen(
        [str(mailq), "--browse", browse.target, "events", "--oldest", "--queue", queue, "--type", "enqueued", "--count", "4",
         "--for", "90", "--json"], cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        acked = [suite.enqueue_stub.Enqueue(inline(queue, simple_mail("before"))).receipt.enqueue_id]
        assert json.loads(follower.stdout.readline())["enqueue_id"] == acked[0]
        browse.kill9()
        acked += [suite.enqueue_stub.Enqueue(inline(queue, simple_mail("during"))).receipt.enqueue_id]
        browse.start()
        acked += [suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"after-{i}"))).receipt.enqueue_id for i in range(2)]
        out, err = follower.communicate(timeout=90)
        assert follower.returncode == 0, err
        assert [json.loads(line)["enqueue_id"] for line in out.splitlines()] == acked[1:]
        assert "the stream was cut" in err and "resuming after cursor" in err
    finally:
        follower.kill()
        browse.stop()


def test_an_event_this_version_cannot_read_is_skipped_and_the_others_are_sent(browse, stub):
    """A rolling update: a newer version records an event type this one does not know, in the
    same stream message as known ones. The watcher gets the known events, before and after it;
    it never ends INVALID_ARGUMENT on a message it cannot change."""
    from services.adapters.rabbitmq.event_stream import BATCH_TYPE
    from services.contract import events_serde
    from stack.harness import broker_parameters

    queue = own_queue("ev")
    known = [events_serde.event_to_proto(e) for e in events(queue, 2)]
    newer = events_pb2.Event(id="from-a-newer-version", type=99, queue=queue)
    call = watch(stub, from_oldest=True, queues=[queue])
    with pika.BlockingConnection(broker_parameters()) as conn:
        conn.channel().basic_publish("", names.event_stream(browse.app.settings.cassandra.keyspace),
                                     events_pb2.EventBatch(events=[known[0], newer, known[1]]).SerializeToString(),
                                     pika.BasicProperties(type=BATCH_TYPE))
    assert [e.id for e in take(call, 2)] == [known[0].id, known[1].id]
    call.cancel()


def test_watchers_past_the_processs_most_are_resource_exhausted_and_a_place_frees_when_one_leaves(keyspace):
    """Each watcher holds a channel on browse_svc's one RabbitMQ connection, which its own work
    needs too: past MAILQUEUE_EVENT_WATCHERS_MAX, a WatchEvents is refused at once."""
    from stack.harness import ServiceProcess, service_env

    browse = ServiceProcess("browse", service_env(keyspace, MAILQUEUE_EVENT_WATCHERS_MAX="2"), metrics=True)
    try:
        stub = events_pb2_grpc.EventServiceStub(browse.channel())
        first, second = Watcher(stub), Watcher(stub)
        wait_until(lambda: browse.metric("mailqueue_event_watchers") == 2, 30, what="two watchers served")
        third = Watcher(stub)
        third.thread.join(30)
        assert third.ended is not None and third.ended.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, third.ended
        assert "MAILQUEUE_EVENT_WATCHERS_MAX" in third.ended.details()
        first.call.cancel()
        wait_until(lambda: browse.metric("mailqueue_event_watchers") == 1, 30, what="the first watcher gone")
        again = Watcher(stub)
        wait_until(lambda: browse.metric("mailqueue_event_watchers") == 2, 30, what="a watcher in its place")
        assert again.ended is None
        second.call.cancel()
        again.call.cancel()
    finally:
        browse.stop()


def test_mailq_events_on_a_quiet_stream_goes_on_past_the_watches_browse_svc_ends(keyspace):
    """browse_svc ends each watch after MAILQUEUE_MAX_CONNECTION_AGE_S so that watchers spread over
    the replicas. mailq events counted each end as a cut, and five in a row with no event between
    them ended the command: a quiet stream stopped being followed after five connection ages."""
    import pathlib
    import subprocess
    import sys
    import tempfile

    from stack.harness import ServiceProcess, service_env

    browse = ServiceProcess("browse", service_env(keyspace, MAILQUEUE_MAX_CONNECTION_AGE_S="1"))
    mailq = pathlib.Path(sys.executable).parent / "mailq"
    try:
        r = subprocess.run([str(mailq), "--browse", browse.target, "events", "--queue", "quiet-stream-q", "--for", "14"],
                           cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)
    finally:
        browse.stop()
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert r.stderr.count("the stream was cut") >= 6, r.stderr  # more than RESUMES ends, each resumed


def test_a_watch_whose_client_stopped_reading_ends_after_its_time(aio_loop, keyspace, monkeypatch):
    """A watch ends itself after its time (MAILQUEUE_MAX_CONNECTION_AGE_S), but only between two
    events: a client that stopped reading (a paused pager) blocked the write of the next one for
    ever, holding its watcher slot and its stream consumer. Past its time and a grace, it ends."""
    from browse_svc.app import BrowseApp
    from services.app import event_watch

    monkeypatch.setattr(event_watch, "STALLED_GRACE_S", 5.0)  # ended 10 s after it began, at the latest
    app = RunningApp(aio_loop, BrowseApp, "browse", service_env(keyspace, MAILQUEUE_MAX_CONNECTION_AGE_S="5"))
    channel = grpc.insecure_channel(app.target, options=[("grpc.http2.bdp_probe", 0)])  # the default window, not grown
    try:
        queue = own_queue("ev")
        for k in range(10):  # 2,000 events of 4 KB: far more than the connection's window and buffers
            publish(app, [dataclasses.replace(e, details={**e.details, "pad": "x" * 4000}) for e in events(queue, 200, start=k * 200)])
        stream = names.event_stream(keyspace)
        others = stream_row(stream)["consumers"]  # watches of the tests before, still ending
        call = events_pb2_grpc.EventServiceStub(channel).WatchEvents(
            events_pb2.WatchEventsRequest(from_oldest=True, queues=[queue]), timeout=120)
        next(call)  # one read, then none
        assert _watching(app) == 1
        wait_until(lambda: _watching(app) == 0, 30, what="the stalled watch ended, its consumer closed")
        wait_until(lambda: stream_row(stream)["consumers"] <= others, 30, what="its stream consumer gone from RabbitMQ")
    finally:
        channel.close()
        app.stop()


def _watching(app) -> int:
    """The watches this browse_svc serves (each holds a stream consumer; read, not driven)."""
    return app.app.backends().stream._watching

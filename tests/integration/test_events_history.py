"""A mail's history (#49), through gRPC with access control on: what each change recorded, in
order, with who made it; what a refused call leaves (nothing); GetMailHistory's statuses;
`mailq trace` as an operator runs it; an operator's delete and move in the history, with the
operator as actor, and in the event stream."""

import asyncio
import contextlib
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid

import grpc
import pytest
from google.protobuf import duration_pb2

from mailqueue.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    browse_pb2,
    browse_pb2_grpc,
    dequeue_pb2_grpc,
    enqueue_pb2,
    enqueue_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    shaping_pb2,
)
from services.adapters.grpc_channels import blocking_channel
from stack.harness import wait_until
from tests.conftest import own_queue
from tests.integration.helpers import StreamConsumer, code_of, inline, simple_mail

TOKENS = {role: role[0] * 24 for role in ("admin", "producer", "consumer", "reader")}
MAILQ = pathlib.Path(sys.executable).parent / "mailq"
T = events_pb2


def identity(role: str) -> str:
    return "token:" + hashlib.sha256(TOKENS[role].encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def secured(aio_loop, running_stack):
    from stack.harness import new_keyspace
    from tests.conftest import Suite

    s = Suite(aio_loop, new_keyspace(), MAILQUEUE_TOKENS=",".join(f"{r}:{t}" for r, t in TOKENS.items()),
              MAILQUEUE_SERVICE_TOKEN=TOKENS["admin"])
    yield s
    s.stop(drop=True)


def stub(s, service, role):
    target = {"enqueue": s.enqueue, "dequeue": s.dequeue}.get(service, s.browse).target
    cls = {"enqueue": enqueue_pb2_grpc.EnqueueServiceStub, "dequeue": dequeue_pb2_grpc.DequeueServiceStub,
           "admin": admin_pb2_grpc.AdminServiceStub, "events": events_pb2_grpc.EventServiceStub,
           "browse": browse_pb2_grpc.BrowseServiceStub}[service]
    return cls(blocking_channel(target, TOKENS[role]))


def new_queue(s) -> str:
    queue = own_queue("ev")
    stub(s, "admin", "admin").CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
    return queue


def history(s, **which) -> list:
    return list(stub(s, "events", "reader").GetMailHistory(T.GetMailHistoryRequest(**which)).events)


def test_a_retried_then_delivered_mail_tells_its_story_with_its_actors(secured):
    # Given a mail enqueued by a producer, answered RETRY once by a consumer, then SUCCESS
    queue = new_queue(secured)
    name = f"story-{uuid.uuid4().hex[:6]}"
    receipt = stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail(name))).receipt
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        first = consumer.next()
        consumer.answer(first, "RETRY", "451 4.7.1 try later", retry_after=0.2)
        second = consumer.next()
        assert second.mail.enqueue_id == receipt.enqueue_id
        consumer.answer(second, "SUCCESS")
        # When its history is read (the SUCCESS is settled after the answer is sent: polled)
        story = wait_until(lambda: (h := history(secured, enqueue_id=receipt.enqueue_id)) and len(h) >= 5 and h,
                           30, what="five events")
    finally:
        consumer.close()
    # Then every change is there, once, in order, with its attempt and who made it
    assert [(T.EventType.Name(e.type), e.attempt) for e in story] == [
        ("EVENT_TYPE_ENQUEUED", 0), ("EVENT_TYPE_HANDED_OUT", 1), ("EVENT_TYPE_RETRY_SCHEDULED", 1),
        ("EVENT_TYPE_HANDED_OUT", 2), ("EVENT_TYPE_DELIVERED", 2)]
    assert [(e.actor.kind, e.actor.role, e.actor.identity) for e in story] == [
        (T.ACTOR_KIND_CALLER, "producer", identity("producer"))] + [(T.ACTOR_KIND_CALLER, "consumer", identity("consumer"))] * 4
    assert len({e.id for e in story}) == 5
    assert all(e.queue == queue and e.name == name and e.sender == "alice@example.com" and e.replica for e in story)
    retry = story[2]
    assert retry.reason == "451 4.7.1 try later" and retry.details["next_attempt_at"] > story[1].time.ToJsonString()[:19]
    assert [e.time.ToDatetime() for e in story] == sorted(e.time.ToDatetime() for e in story)
    # And by name the same story; read again, the same ids (nothing is rewritten by reading)
    assert [e.id for e in history(secured, name=name)] == [e.id for e in story]
    # And `mailq trace` prints it, a line per event
    printed = mailq(secured, "trace", receipt.enqueue_id).stdout
    print(f"\n{printed}")
    assert [line.split()[2] for line in printed.splitlines()[1:]] == [
        "enqueued", "handed_out", "retry_scheduled", "handed_out", "delivered"]


def test_each_enqueued_event_names_its_own_caller_when_callers_share_a_group(secured):
    """Concurrent Enqueues run as one group, in the task of the call that started it: each mail's
    ENQUEUED event still names the caller that enqueued it."""
    # Given a producer and an admin enqueueing at once, 30 calls each in flight together
    queue = new_queue(secured)
    calls = []
    for i in range(30):
        for role in ("producer", "admin"):
            calls.append((role, stub(secured, "enqueue", role).Enqueue.future(inline(queue, simple_mail(f"{role}-{i}")))))
    receipts = [(role, f.result(timeout=60).receipt.enqueue_id) for role, f in calls]
    # When each mail's history is read
    actors = {}
    for role, enqueue_id in receipts:
        enqueued = [e for e in history(secured, enqueue_id=enqueue_id) if e.type == T.EVENT_TYPE_ENQUEUED]
        assert len(enqueued) == 1
        actors[enqueue_id] = (role, enqueued[0].actor.role, enqueued[0].actor.identity)
    # Then each names its own caller
    wrong = [a for a in actors.values() if a[1:] != (a[0], identity(a[0]))]
    assert wrong == [], f"{len(wrong)} of {len(actors)} ENQUEUED events name another caller: {wrong[:3]}"


def test_an_enqueue_the_event_stream_refuses_is_undone_and_leaves_no_history(secured):
    """The history is written first, then the stream: when the stream refuses the events (its
    queue deleted, so they are unroutable), the caller gets UNAVAILABLE, the mail is undone, and
    the history rows of the change are taken back: a mail never enqueued has no ENQUEUED event.
    (The next publish declares the stream again: what it held before is gone, as after an
    operator's reset.)"""
    import pika

    from stack.harness import broker_parameters

    queue = new_queue(secured)
    name = f"refused-{uuid.uuid4().hex[:6]}"
    stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail("first")))  # the stream declared by now
    connection = pika.BlockingConnection(broker_parameters())
    try:
        connection.channel().queue_delete(f"mailqueue._events.{secured.keyspace}")
    finally:
        connection.close()
    # When a mail is enqueued then
    code = code_of(lambda: stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail(name)), timeout=30))
    # Then it was refused, is not queued, and its history is empty
    assert code == grpc.StatusCode.UNAVAILABLE
    assert [r.mail.mail.name for r in stub(secured, "browse", "admin").Browse(browse_pb2.BrowseRequest(queue=queue))] == ["first"]
    assert history(secured, name=name) == []
    # And once the stream is back, the same mail sent again is enqueued with its one event
    receipt = wait_until(lambda: _enqueued_or_none(secured, queue, name), 30, what="an enqueue once the stream is back")
    assert [T.EventType.Name(e.type) for e in history(secured, enqueue_id=receipt.enqueue_id)] == ["EVENT_TYPE_ENQUEUED"]
    assert [T.EventType.Name(e.type) for e in history(secured, name=name)] == ["EVENT_TYPE_ENQUEUED"]


def test_an_enqueue_whose_history_was_written_in_part_is_undone_and_leaves_no_history(secured, monkeypatch):
    """A group's history is several requests (its row, its names' rows in batches): one of them
    failing undoes the enqueue, and the rows the others wrote are taken back (they stayed: a mail
    never enqueued had an ENQUEUED event, found by the other mails' names)."""
    from services.adapters.cassandra.event_log import CassandraEventLog
    from services.domain.errors import BackendUnavailable

    queue, tag = new_queue(secured), uuid.uuid4().hex[:6]
    names = [f"part-{tag}-{i:02d}" for i in range(32)]
    poison = names[-1]
    write = CassandraEventLog._write

    async def failing(self, rows):
        if any(values[0] == poison for _, values, _ in rows):
            raise BackendUnavailable("cassandra", "injected on the request of one name row")
        await write(self, rows)

    monkeypatch.setattr(CassandraEventLog, "_write", failing)
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(n))) for i, n in enumerate(names)]
    results = [r for b in stub(secured, "enqueue", "producer").EnqueueBatches(iter([enqueue_pb2.EnqueueBatchesRequest(mails=many)]),
                                                                             timeout=60) for r in b.results]
    monkeypatch.undo()
    # The group with the poisoned name row was refused whole (a mail that came first may have run alone)
    by_name = {names[r.sequence]: r for r in results}
    refused = [n for n in names if by_name[n].HasField("error")]
    assert poison in refused and len(refused) >= 16, [by_name[n].WhichOneof("result") for n in names]
    assert {by_name[n].error.code for n in refused} == {grpc.StatusCode.UNAVAILABLE.value[0]}
    browsed = [r.mail.mail.name for r in stub(secured, "browse", "admin").Browse(browse_pb2.BrowseRequest(queue=queue))]
    assert sorted(browsed) == [n for n in names if n not in refused]
    for name in refused:  # not one ENQUEUED event, under any of the group's names
        assert history(secured, name=name) == [], name


def _enqueued_or_none(s, queue: str, name: str):
    try:
        return stub(s, "enqueue", "producer").Enqueue(inline(queue, simple_mail(name)), timeout=10).receipt
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None


def test_watching_a_type_written_to_the_history_only_is_refused(secured):
    # SWEPT events are written by the retention sweep to the history, never to the stream
    watch = stub(secured, "events", "reader").WatchEvents(T.WatchEventsRequest(types=[T.EVENT_TYPE_SWEPT]), timeout=10)
    assert code_of(lambda: next(iter(watch))) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_mail_out_unanswered_shows_its_hand_out_within_the_delay_and_once_answered_each_event_once(secured):
    # Given a mail handed out to a consumer that does not answer yet (the hand-out event waits for
    # the answer's, MAILQUEUE_HANDOUT_EVENT_DELAY_MS, 1 s by default, then is written alone)
    queue = new_queue(secured)
    eid = stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail("out"))).receipt.enqueue_id
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        delivery = consumer.next()
        handed_at = time.monotonic()
        # When its history is read while it is out
        story = wait_until(lambda: (h := history(secured, enqueue_id=eid)) and len(h) >= 2 and h, 10, what="HANDED_OUT")
        shown_after = time.monotonic() - handed_at
        # Then it shows the hand-out within the delay (and the poll's pace), before any answer
        print(f"HANDED_OUT of an unanswered delivery in the history {shown_after:.2f} s after the delivery was read")
        assert types(story) == ["ENQUEUED", "HANDED_OUT"] and shown_after < 3
        # And once answered, the story has each event once, the hand-out not written again
        consumer.answer(delivery, "SUCCESS")
        story = wait_until(lambda: (h := history(secured, enqueue_id=eid)) and len(h) >= 3 and h, 30, what="DELIVERED")
    finally:
        consumer.close()
    assert types(story) == ["ENQUEUED", "HANDED_OUT", "DELIVERED"]
    assert len({e.id for e in story}) == 3


def test_a_refused_enqueue_leaves_no_event(secured):
    queue = new_queue(secured)
    name = f"refused-{uuid.uuid4().hex[:6]}"
    producer = stub(secured, "enqueue", "producer")
    bad = simple_mail(name, recipients=())  # no recipient: INVALID_ARGUMENT, nothing written
    assert code_of(lambda: producer.Enqueue(inline(queue, bad))) == grpc.StatusCode.INVALID_ARGUMENT
    reader = stub(secured, "enqueue", "reader")  # a role that may not enqueue
    assert code_of(lambda: reader.Enqueue(inline(queue, simple_mail(name)))) == grpc.StatusCode.PERMISSION_DENIED
    # A later good mail of the same name is recorded: the by-name read works, and the refused ones are not in it
    ok = producer.Enqueue(inline(queue, simple_mail(name))).receipt
    assert [(e.enqueue_id, T.EventType.Name(e.type)) for e in history(secured, name=name)] == [
        (ok.enqueue_id, "EVENT_TYPE_ENQUEUED")]


def test_a_resend_with_the_same_idempotency_key_is_one_enqueued_event(secured):
    queue = new_queue(secured)
    producer = stub(secured, "enqueue", "producer")
    key = uuid.uuid4().hex
    first = producer.Enqueue(inline(queue, simple_mail("once"), key=key)).receipt
    before = history(secured, enqueue_id=first.enqueue_id)
    assert [T.EventType.Name(e.type) for e in before] == ["EVENT_TYPE_ENQUEUED"] and "resent" not in before[0].details
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)  # the mail lives an attempt meanwhile
    try:
        consumer.answer(consumer.next(), "RETRY", "451 4.7.1 try later", retry_after=60)
        wait_until(lambda: len(history(secured, enqueue_id=first.enqueue_id)) == 3, 30, what="the RETRY recorded")
    finally:
        consumer.close()
    again = producer.Enqueue(inline(queue, simple_mail("once"), key=key)).receipt
    assert again.enqueue_id == first.enqueue_id
    after = [e for e in history(secured, enqueue_id=first.enqueue_id) if e.type == T.EVENT_TYPE_ENQUEUED]
    # One event, its id, time and attempt (0: the enqueue's, not the mail's since) unchanged, marked resent
    assert [(e.id, e.time, e.attempt) for e in after] == [(before[0].id, before[0].time, 0)]
    assert after[0].details["resent"] == "true"


def test_bad_requests_and_roles(secured):
    events = stub(secured, "events", "reader")
    for request in (T.GetMailHistoryRequest(), T.GetMailHistoryRequest(enqueue_id="not-a-uuid"),
                    T.GetMailHistoryRequest(name=""), T.GetMailHistoryRequest(enqueue_id="")):
        assert code_of(lambda r=request: events.GetMailHistory(r)) == grpc.StatusCode.INVALID_ARGUMENT, request
    # Nothing recorded: an empty story, not NOT_FOUND (the mail may be older than the retention)
    assert list(events.GetMailHistory(T.GetMailHistoryRequest(enqueue_id=str(uuid.uuid4()))).events) == []
    # Readers and admins may read histories; producers and consumers may not
    assert history(secured, name="nobody") == []
    assert stub(secured, "events", "admin").GetMailHistory(T.GetMailHistoryRequest(name="nobody")).events is not None
    for role in ("producer", "consumer"):
        denied = stub(secured, "events", role)
        assert code_of(lambda d=denied: d.GetMailHistory(T.GetMailHistoryRequest(name="x"))) == grpc.StatusCode.PERMISSION_DENIED


class Forwarder:
    """A TCP forwarder to Cassandra, on a loop of its own (the services block theirs at times):
    closed, the browse service behind it has lost its Cassandra (connections reset, nothing
    listening), as in an outage."""

    def __init__(self) -> None:
        from tests.inprocess import LoopThread

        self._loop = loop = LoopThread()
        self._pipes: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

        async def start():
            return await asyncio.start_server(self._pipe, "127.0.0.1", 0)

        self.server = loop.run(start())
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer) -> None:
        self._tasks.add(asyncio.current_task())
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 9042)
        self._pipes |= {writer, up_writer}

        async def copy(src, dst):
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def close(self) -> None:
        async def close():
            self.server.close()
            for w in self._pipes:
                w.close()
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        self._loop.run(close())
        self._loop.stop()


def test_history_unreadable_is_unavailable(secured):
    from browse_svc.app import BrowseApp
    from tests.inprocess import RunningApp

    forwarder = Forwarder()
    browse = RunningApp(secured.loop, BrowseApp, "browse", {**secured.env, "MAILQUEUE_CASSANDRA_PORT": str(forwarder.port),
                                                            "MAILQUEUE_HEAL_INTERVAL_S": "0", "MAILQUEUE_GAUGE_INTERVAL_S": "0"})
    try:
        events = events_pb2_grpc.EventServiceStub(blocking_channel(browse.target, TOKENS["reader"]))
        request = T.GetMailHistoryRequest(enqueue_id=str(uuid.uuid4()))
        assert list(events.GetMailHistory(request).events) == []  # served through the forwarder
        forwarder.close()
        assert wait_until(lambda: code_of(lambda: events.GetMailHistory(request)) == grpc.StatusCode.UNAVAILABLE,
                          30, what="UNAVAILABLE")
    finally:
        browse.stop()


def run_mailq(s, *args: str) -> subprocess.CompletedProcess:
    """mailq as a shell runs it, whatever its exit status (the reader's token)."""
    targets = ["--enqueue", s.enqueue.target, "--dequeue", s.dequeue.target, "--browse", s.browse.target,
               "--blob", s.blob.target, "--token", TOKENS["reader"]]
    return subprocess.run([str(MAILQ), *targets, *args], cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=120)


def mailq(s, *args: str) -> subprocess.CompletedProcess:
    r = run_mailq(s, *args)
    assert r.returncode == 0, r.stderr
    return r


def test_mailq_trace_prints_the_story(secured):
    queue = new_queue(secured)
    name = f"traced-{uuid.uuid4().hex[:6]}"
    receipt = stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail(name))).receipt
    # By a prefix of a live mail's id (resolved among the live mails), by full id, by name
    out = mailq(secured, "trace", receipt.enqueue_id[:8]).stdout
    print(f"\n{out}")
    header, line = out.splitlines()
    assert header.split()[:4] == ["TIME", "(UTC)", "EVENT", "QUEUE"]
    assert line.split()[2:6] == ["enqueued", queue, "0", f"producer:{identity('producer')}"]
    assert mailq(secured, "trace", receipt.enqueue_id).stdout == out
    rows = [json.loads(x) for x in mailq(secured, "trace", "--name", name, "--json").stdout.splitlines()]
    assert [(r["type"], r["enqueue_id"], r["actor"]) for r in rows] == [
        ("enqueued", receipt.enqueue_id, f"producer:{identity('producer')}")]


def test_mailq_events_follows_the_stream_and_resumes_from_the_cursor_it_prints(secured):
    # Given a queue with two mails enqueued, one after the other
    queue = new_queue(secured)
    producer = stub(secured, "enqueue", "producer")
    first, second = (producer.Enqueue(inline(queue, simple_mail(f"ev-{i}"))).receipt for i in range(2))
    # When an operator follows that queue's ENQUEUED events from the oldest kept, for one event
    r = run_mailq(secured, "events", "--oldest", "--queue", queue, "--type", "enqueued", "--count", "1", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(x) for x in r.stdout.splitlines()]
    # Then it is the first mail's, with its actor and a cursor, and stderr says how to go on from there
    assert (row["type"], row["queue"], row["enqueue_id"]) == ("enqueued", queue, first.enqueue_id)
    assert row["actor"] == f"producer:{identity('producer')}" and row["cursor"]
    assert f"mailq events --cursor {row['cursor']}" in r.stderr
    assert f"--queue {queue} --type enqueued --json" in r.stderr  # with the same filters
    # And the printed command goes on after that event: the second mail's, once; --for ends a quiet stream
    r = run_mailq(secured, "events", "--cursor", row["cursor"], "--queue", queue, "--type", "enqueued", "--for", "5", "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["enqueue_id"] for x in r.stdout.splitlines()] == [second.enqueue_id]
    # And a run given the last cursor with --count 1 waits for a new event rather than repeat that one
    last = json.loads(r.stdout.splitlines()[-1])["cursor"]
    r = run_mailq(secured, "events", "--cursor", last, "--queue", queue, "--count", "1", "--for", "3", "--json")
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    # And as text, a line per event: time, type, queue, mail, attempt, actor
    r = run_mailq(secured, "events", "--oldest", "--queue", queue, "--type", "enqueued", "--count", "2")
    assert r.returncode == 0, r.stderr
    print(f"\n{r.stdout}{r.stderr}")
    assert [line.split()[2:7] for line in r.stdout.splitlines()] == [
        ["enqueued", queue, m.enqueue_id[:8], "0", f"producer:{identity('producer')}"] for m in (first, second)]


@pytest.mark.parametrize("args, status, says", [
    (["--cursor", "not-a-cursor"], 1, "INVALID_ARGUMENT"),
    (["--cursor", "1:0", "--oldest"], 2, "not allowed with"),
    (["--type", "sent"], 2, "unknown event type sent"),
    (["--count", "-1"], 2, "--count: -1 is out of range: 0 to"),
    (["--for", "0"], 2, "--for: 0 is out of range: more than 0"),
])
def test_mailq_events_refuses_what_it_cannot_follow(secured, args, status, says):
    r = run_mailq(secured, "events", *args, "--for", "10") if "--for" not in args else run_mailq(secured, "events", *args)
    assert (r.returncode, r.stdout) == (status, ""), r.stderr
    assert says in r.stderr


def test_a_client_certificate_is_the_actor(secured, tmp_path):
    # Given enqueue_svc and browse_svc with mutual TLS: the "ops" certificate (CN ops) is an admin
    import os

    from browse_svc.app import BrowseApp
    from enqueue_svc.app import EnqueueApp
    from stack.harness import service_env
    from tests.inprocess import RunningApp
    from tests.pki import PKI

    pki = PKI(tmp_path)
    pki.issue("server", "mailqueue", "IP:127.0.0.1,DNS:localhost")
    pki.issue("ops", "ops", "DNS:ops.example.org")
    env = service_env(secured.keyspace, MAILQUEUE_TLS_CERT_FILE=os.path.join(pki.path, "server.crt"),
                      MAILQUEUE_TLS_KEY_FILE=os.path.join(pki.path, "server.key"), MAILQUEUE_TLS_CLIENT_CA_FILE=pki.ca,
                      MAILQUEUE_TLS_IDENTITIES="ops=admin", MAILQUEUE_HEAL_INTERVAL_S="0", MAILQUEUE_GAUGE_INTERVAL_S="0",
                      MAILQUEUE_BLOB_TARGET=secured.blob.target, MAILQUEUE_SERVICE_TOKEN=TOKENS["admin"])
    env.pop("MAILQUEUE_PLAINTEXT", None)
    enqueue, browse = RunningApp(secured.loop, EnqueueApp, "enqueue", env), RunningApp(secured.loop, BrowseApp, "browse", env)
    try:
        queue = new_queue(secured)
        # When it enqueues a mail
        channel = grpc.secure_channel(enqueue.target, pki.credentials("ops"))
        receipt = enqueue_pb2_grpc.EnqueueServiceStub(channel).Enqueue(inline(queue, simple_mail("by-cert")), timeout=30).receipt
        # Then the event's actor is the certificate's identity with its role
        events = events_pb2_grpc.EventServiceStub(grpc.secure_channel(browse.target, pki.credentials("ops")))
        (e,) = events.GetMailHistory(T.GetMailHistoryRequest(enqueue_id=receipt.enqueue_id), timeout=30).events
        assert (e.actor.kind, e.actor.role, e.actor.identity) == (T.ACTOR_KIND_CALLER, "admin", "ops")
    finally:
        enqueue.stop()
        browse.stop()


def test_a_certificate_identity_with_spaces_is_a_tenant_a_quota_limits(secured, tmp_path):
    """A certificate named only by its identity (no ``role@tenant``) counts towards the quotas of
    that identity as its tenant. A CN with spaces ("Relay Ops 1") was accepted as an identity but
    refused as a quota's tenant (INVALID_ARGUMENT): such a caller could never be limited."""
    import os

    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from enqueue_svc.app import EnqueueApp
    from mailqueue.v1 import quotas_pb2
    from stack.harness import service_env
    from tests.inprocess import RunningApp
    from tests.pki import PKI

    pki = PKI(tmp_path)
    pki.issue("server", "mailqueue", "IP:127.0.0.1,DNS:localhost")
    pki.issue("relay", "Relay Ops 1", "DNS:relay.example.org")
    env = service_env(secured.keyspace, MAILQUEUE_TLS_CERT_FILE=os.path.join(pki.path, "server.crt"),
                      MAILQUEUE_TLS_KEY_FILE=os.path.join(pki.path, "server.key"), MAILQUEUE_TLS_CLIENT_CA_FILE=pki.ca,
                      MAILQUEUE_TLS_IDENTITIES="Relay Ops 1=producer", MAILQUEUE_BLOB_TARGET=secured.blob.target,
                      MAILQUEUE_SERVICE_TOKEN=TOKENS["admin"])
    env.pop("MAILQUEUE_PLAINTEXT", None)
    enqueue = RunningApp(secured.loop, EnqueueApp, "enqueue", env)
    admin = stub(secured, "admin", "admin")
    tenant = quotas_pb2.Quota(kind=quotas_pb2.QUOTA_KIND_TENANT, subject="Relay Ops 1", mails_per_s=1e-6, burst_mails=1)
    try:
        queue = new_queue(secured)
        admin.SetQuota(admin_pb2.SetQuotaRequest(quota=tenant), timeout=30)
        relay = enqueue_pb2_grpc.EnqueueServiceStub(grpc.secure_channel(enqueue.target, pki.credentials("relay")))

        def refusal():  # enqueues until the quota (burst 1) is in force on this replica and refuses
            try:
                relay.Enqueue(inline(queue, simple_mail("relay")), timeout=30)
                return None
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                return e

        refused = wait_until(refusal, 30, what="the tenant's quota refusing its second mail")
        (detail,) = [d for d in rpc_status.from_call(refused).details if d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR)]
        failure = error_details_pb2.QuotaFailure()
        detail.Unpack(failure)
        assert failure.violations[0].subject == "tenant:Relay Ops 1"
    finally:
        admin.ClearQuota(admin_pb2.ClearQuotaRequest(kind=quotas_pb2.QUOTA_KIND_TENANT, subject="Relay Ops 1"), timeout=30)
        enqueue.stop()


# ---------------------------------------------------------------- the audit trail: operators' changes
def types(events) -> list[str]:
    return [T.EventType.Name(e.type).removeprefix("EVENT_TYPE_") for e in events]


def test_a_deleted_mail_names_the_operator_and_a_refused_delete_records_nothing(secured):
    # Given two mails enqueued by a producer
    queue = new_queue(secured)
    enqueue = stub(secured, "enqueue", "producer")
    kept, deleted = (enqueue.Enqueue(inline(queue, simple_mail(f"a-{i}"))).receipt.enqueue_id for i in range(2))
    admin = stub(secured, "admin", "admin")
    # When an operator's DeleteMails is refused (an id that is not a UUID), then one by id succeeds
    with pytest.raises(grpc.RpcError) as refused:
        list(admin.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, enqueue_ids=admin_pb2.EnqueueIds(ids=["nope"]))))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert types(history(secured, enqueue_id=kept)) == ["ENQUEUED"]
    list(admin.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, enqueue_ids=admin_pb2.EnqueueIds(ids=[deleted]))))
    # Then the deleted mail's history ends DELETED by the admin; the other mail's has no change
    story = wait_until(lambda: (h := history(secured, enqueue_id=deleted)) and len(h) >= 2 and h, 30, what="DELETED")
    assert types(story) == ["ENQUEUED", "DELETED"]
    assert (story[-1].actor.role, story[-1].actor.identity) == ("admin", identity("admin"))
    assert story[0].actor.role == "producer"
    assert types(history(secured, enqueue_id=kept)) == ["ENQUEUED"]


def test_a_moved_mail_keeps_its_story_under_its_new_id_and_the_stream_carries_it(secured):
    # Given a watcher of two new queues (from the oldest event kept: only theirs pass the filter), and a
    # mail enqueued in one of them
    src, dst = new_queue(secured), new_queue(secured)
    watcher = stub(secured, "events", "reader").WatchEvents(T.WatchEventsRequest(queues=[src, dst], from_oldest=True), timeout=60)
    name = f"moved-{uuid.uuid4().hex[:6]}"
    eid = stub(secured, "enqueue", "producer").Enqueue(inline(src, simple_mail(name))).receipt.enqueue_id
    # When an operator moves it to another queue
    moves = list(stub(secured, "admin", "admin").MoveMails(admin_pb2.MoveMailsRequest(queue=src, to_queue=dst)))
    assert moves[-1].moved == 1
    # Then its history says where it went, under which id, and by whom
    story = wait_until(lambda: (h := history(secured, enqueue_id=eid)) and len(h) >= 2 and h, 30, what="MOVED")
    assert types(story) == ["ENQUEUED", "MOVED"]
    moved = story[-1]
    assert moved.details["to_queue"] == dst and moved.actor.role == "admin"
    new_id = moved.details["to_enqueue_id"]
    assert new_id != eid
    # and the history by name tells the whole story, across both ids
    by_name = history(secured, name=name)
    assert {e.enqueue_id for e in by_name} >= {eid} and "MOVED" in types(by_name)
    # and the stream carried the same events, each with a cursor
    seen = []
    for response in watcher:
        seen.append(response.event)
        if any(e.type == T.EVENT_TYPE_MOVED for e in seen):
            break
    watcher.cancel()
    assert [e.id for e in seen if e.enqueue_id == eid] == [e.id for e in story]
    assert all(e.cursor for e in seen)
    # And once delivered from the queue it went to, its history by its first id, or by name, tells the
    # whole story: the move followed to the new id
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), dst)
    try:
        consumer.answer(consumer.next(), "SUCCESS")
        whole = wait_until(lambda: (h := history(secured, enqueue_id=eid)) and len(h) >= 4 and h, 30, what="DELIVERED")
    finally:
        consumer.close()
    assert types(whole) == ["ENQUEUED", "MOVED", "HANDED_OUT", "DELIVERED"]
    assert [e.enqueue_id for e in whole] == [eid, eid, new_id, new_id] and whole[-1].queue == dst
    assert [e.id for e in history(secured, name=name)] == [e.id for e in whole]


def queue_events(s, queue: str, *kinds: str, count: int) -> list:
    """The first ``count`` events of ``queue`` of those types in the stream (from the oldest kept)."""
    call = stub(s, "events", "reader").WatchEvents(T.WatchEventsRequest(
        queues=[queue], from_oldest=True, types=[T.EventType.Value(f"EVENT_TYPE_{k}") for k in kinds]), timeout=30)
    seen = []
    for response in call:
        seen.append(response.event)
        if len(seen) == count:
            break
    call.cancel()
    return seen


def test_flush_and_republish_name_the_operator_and_a_retried_republish_is_the_same_event(secured):  # ~1 s
    # Given a delayed mail and a ready one
    queue = new_queue(secured)
    enqueue = stub(secured, "enqueue", "producer")
    request = inline(queue, simple_mail("later"))
    request.delay.FromSeconds(3600)
    later = enqueue.Enqueue(request).receipt.enqueue_id
    ready = enqueue.Enqueue(inline(queue, simple_mail("ready"))).receipt.enqueue_id
    admin = stub(secured, "admin", "admin")
    # When a refused Flush and RepublishNotProcessed (no such queue) are made, then the queue is flushed
    # and republished twice (a retried call)
    absent = admin_pb2.FlushRequest(queue=f"absent-{uuid.uuid4().hex[:6]}")
    assert code_of(lambda: admin.Flush(absent)) == grpc.StatusCode.NOT_FOUND
    assert admin.Flush(admin_pb2.FlushRequest(queue=queue)).flushed == 1
    for _ in range(2):
        assert admin.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
            queue=queue, older_than=duration_pb2.Duration())).republished == 2
    # Then the delayed mail's history says FLUSHED, then REPUBLISHED, by the admin; the ready one's
    # REPUBLISHED once (same id for the retried call), by the admin
    assert types(history(secured, enqueue_id=later)) == ["ENQUEUED", "FLUSHED", "REPUBLISHED"]
    story = history(secured, enqueue_id=ready)
    assert types(story) == ["ENQUEUED", "REPUBLISHED"] and story[-1].details["by"] == "operator"
    assert all((e.actor.role, e.actor.identity) == ("admin", identity("admin"))
               for e in [*history(secured, enqueue_id=later)[1:], story[-1]])


def test_lifting_a_hold_rule_releases_its_mails_each_recorded_with_the_operator(secured):  # ~3 s
    # Given a hold rule in force on every dequeue replica and a mail it held (recorded HELD, actor rule)
    queue = new_queue(secured)
    admin = stub(secured, "admin", "admin")
    rule = admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD, reason="audit", queue=queue, sender="held@example.com")
    rule.expires_at.FromSeconds(int(time.time()) + 3600)
    rule_id = admin.AddRule(admin_pb2.AddRuleRequest(rule=rule)).rule.rule_id
    dequeuer = secured.dequeue.app.service()
    wait_until(lambda: any(str(r.rule_id) == rule_id for r in secured.run(dequeuer.rules.current())), 10, what="the rule")
    eid = stub(secured, "enqueue", "producer").Enqueue(
        inline(queue, simple_mail("held", sender="held@example.com"))).receipt.enqueue_id
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        wait_until(lambda: "HELD" in types(history(secured, enqueue_id=eid)), 15, what="HELD")
        # When the operator lifts the rule
        assert admin.LiftRule(admin_pb2.LiftRuleRequest(rule_id=rule_id)).released == 1
        assert consumer.next().mail.enqueue_id == eid
        story = wait_until(lambda: (h := history(secured, enqueue_id=eid)) and len(h) >= 4 and h, 30, what="HANDED_OUT")
    finally:
        consumer.close()
    # Then the mail's history says HELD by the rule (never handed out), then RELEASED by the operator,
    # naming the rule, then handed out; and the stream carries the rule's RULE_CHANGED, added then
    # removed, by the operator
    assert types(story) == ["ENQUEUED", "HELD", "RELEASED", "HANDED_OUT"]
    held, released = story[1:3]
    assert (held.actor.kind, held.actor.identity, held.details["rule_id"]) == (T.ACTOR_KIND_COMPONENT, "rule", rule_id)
    assert (released.actor.role, released.details["rule_id"]) == ("admin", rule_id)
    changes = queue_events(secured, queue, "RULE_CHANGED", count=2)
    assert [(e.details["change"], e.details["rule_id"], e.actor.role) for e in changes] == [
        ("added", rule_id, "admin"), ("removed", rule_id, "admin")]


def test_an_expiry_a_reject_and_an_operators_redrive_purge_and_clear_are_each_recorded(secured):  # ~4 s
    # Given a queue whose mails expire at their first RETRY, two mails consumed there, and a third queue
    admin = stub(secured, "admin", "admin")
    queue, other = own_queue("ev"), new_queue(secured)
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue, retry_policy=browse_pb2.RetryPolicy(max_attempts=1)))
    enqueue = stub(secured, "enqueue", "producer")
    names = {k: f"{k}-{uuid.uuid4().hex[:6]}" for k in ("expired", "rejected", "cleared")}
    ids = {k: enqueue.Enqueue(inline(queue, simple_mail(names[k]))).receipt.enqueue_id for k in ("expired", "rejected")}
    # When a consumer answers RETRY to one (its last attempt) and REJECT to the other
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        for d in (consumer.next(), consumer.next()):
            expiring = d.mail.enqueue_id == ids["expired"]
            consumer.answer(d, "RETRY" if expiring else "REJECT", "451 later" if expiring else "550 no such user")
        wait_until(lambda: all(len(history(secured, enqueue_id=i)) >= 3 for i in ids.values()), 30, what="the answers")
    finally:
        consumer.close()
    # and an operator redrives the rejected one, purges the expired one and clears a third mail
    ids["cleared"] = enqueue.Enqueue(inline(queue, simple_mail(names["cleared"]))).receipt.enqueue_id
    redrive = admin_pb2.RedriveDeadLettersRequest(queue=queue, to_queue=other, filter=browse_pb2.DeadLetterFilter(name=names["rejected"]))
    assert list(admin.RedriveDeadLetters(redrive))[-1].redriven == 1
    purge = admin_pb2.PurgeDeadLettersRequest(queue=queue, filter=browse_pb2.DeadLetterFilter(name=names["expired"]))
    assert list(admin.PurgeDeadLetters(purge))[-1].purged == 1
    assert list(admin.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue)))[-1].progress.deleted == 1
    # Then each mail's story ends with what was done to it, and by whom
    story = {k: history(secured, enqueue_id=i) for k, i in ids.items()}
    assert types(story["expired"]) == ["ENQUEUED", "HANDED_OUT", "EXPIRED", "PURGED"]
    assert types(story["rejected"]) == ["ENQUEUED", "HANDED_OUT", "REJECTED", "REDRIVEN"]
    assert types(story["cleared"]) == ["ENQUEUED", "CLEARED"]
    expired, rejected, redriven = story["expired"][2], story["rejected"][2], story["rejected"][3]
    assert (expired.actor.kind, expired.actor.identity) == (T.ACTOR_KIND_COMPONENT, "expiry") and "max_attempts 1" in expired.reason
    assert (rejected.actor.role, rejected.reason) == ("consumer", "550 no such user")
    assert redriven.details["to_queue"] == other and story["expired"][3].actor.role == story["cleared"][1].actor.role == "admin"


def test_retry_policy_throttle_and_bounce_changes_are_recorded_and_a_refused_one_is_not(secured):  # ~2 s
    # Given a queue with a mail
    admin = stub(secured, "admin", "admin")
    queue = new_queue(secured)
    eid = stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail("bounce-me", sender="b@example.com"))).receipt.enqueue_id
    # When an operator's retry-policy change is refused, then two are made; a throttle is set; and a
    # bounce rule is added that matches the queued mail
    update = lambda **p: admin.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(  # noqa: E731
        queue=queue, retry_policy=browse_pb2.RetryPolicy(**p)))
    assert code_of(lambda: update(multiplier=0.5)) == grpc.StatusCode.INVALID_ARGUMENT
    update(max_attempts=7)
    update(max_attempts=9)
    admin.SetThrottle(admin_pb2.SetThrottleRequest(throttle=shaping_pb2.Throttle(
        destination="slow.example", queue=queue, rate=shaping_pb2.Rate(count=5, per=shaping_pb2.RATE_PERIOD_SECOND))))
    rule = admin_pb2.Rule(kind=admin_pb2.RULE_KIND_BOUNCE, reason="spam run", queue=queue, sender="b@example.com")
    rule.expires_at.FromSeconds(int(time.time()) + 3600)
    added = admin.AddRule(admin_pb2.AddRuleRequest(rule=rule))
    assert added.applied == 1
    # Then the stream has the two policy changes only (the refused one recorded nothing), with what
    # changed; the throttle; the rule; and the bounced mail's history names the operator and the rule
    changes = queue_events(secured, queue, "CONFIG_CHANGED", "SHAPING_CHANGED", "RULE_CHANGED", count=4)
    assert [(types([e])[0], e.actor.role) for e in changes] == [
        ("CONFIG_CHANGED", "admin"), ("CONFIG_CHANGED", "admin"), ("SHAPING_CHANGED", "admin"), ("RULE_CHANGED", "admin")]
    assert [(e.details["setting"], e.details["max_attempts"]) for e in changes[:2]] == [("retry_policy", "7"), ("retry_policy", "9")]
    assert changes[2].details["destination"] == "slow.example" and changes[3].details["change"] == "added"
    bounced = history(secured, enqueue_id=eid)[-1]
    assert (types([bounced]), bounced.actor.role, bounced.details["rule_id"]) == (["BOUNCED"], "admin", added.rule.rule_id)


def test_a_setting_set_back_and_forth_is_a_new_event_each_time(secured):  # ~2 s
    # Given a queue; when an operator sets its retry policy 7, 9, 7, 9 attempts, and sets, clears
    # and sets again one throttle and one quota on it (the same values each time)
    from mailqueue.v1 import quotas_pb2

    admin = stub(secured, "admin", "admin")
    queue = new_queue(secured)
    for n in (7, 9, 7, 9):
        admin.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(queue=queue, retry_policy=browse_pb2.RetryPolicy(max_attempts=n)))
    throttle = shaping_pb2.Throttle(destination="slow.example", queue=queue, rate=shaping_pb2.Rate(count=5, per=shaping_pb2.RATE_PERIOD_SECOND))
    quota = quotas_pb2.Quota(kind=quotas_pb2.QUOTA_KIND_QUEUE, subject=queue, mails_per_s=50, burst_mails=10)
    for _ in range(2):
        admin.SetThrottle(admin_pb2.SetThrottleRequest(throttle=throttle))
        admin.SetQuota(admin_pb2.SetQuotaRequest(quota=quota))
        if not _:
            assert admin.ClearThrottle(admin_pb2.ClearThrottleRequest(destination="slow.example", queue=queue)).cleared
            assert admin.ClearQuota(admin_pb2.ClearQuotaRequest(kind=quotas_pb2.QUOTA_KIND_QUEUE, subject=queue)).cleared
    # Then each of the ten changes is an event of its own: a consumer that drops duplicates by id
    # (as the docs say) keeps all ten
    changes = queue_events(secured, queue, "CONFIG_CHANGED", "SHAPING_CHANGED", "QUOTA_CHANGED", count=10)
    assert [e.details.get("max_attempts") for e in changes if types([e]) == ["CONFIG_CHANGED"]] == ["7", "9", "7", "9"]
    assert len({e.id for e in changes}) == 10, [(types([e]), e.id) for e in changes]


def test_a_group_of_mails_is_a_history_row_per_write_and_a_name_row_per_group(secured):
    # Given 60 mails of one name (a campaign's) enqueued in one EnqueueBatches call
    from mailqueue.v1 import enqueue_pb2
    from services.adapters.cassandra.schema import MAIL_HISTORY_GROUPS, MAIL_HISTORY_NAMES
    from services.domain.events import history_key

    queue, name = new_queue(secured), f"campaign-{uuid.uuid4().hex[:6]}"
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(name))) for i in range(60)]
    answers = [r for b in stub(secured, "enqueue", "producer").EnqueueBatches(
        iter([enqueue_pb2.EnqueueBatchesRequest(mails=many)]), timeout=60) for r in b.results]
    ids = [uuid.UUID(r.receipt.enqueue_id) for r in answers]
    assert len(ids) == 60 and len(set(ids)) == 60
    # Then their 60 ENQUEUED events are a row per history key, not one per event: the mails of a
    # group share a key; and the name is a row per key, not one per mail
    keys = {history_key(i) for i in ids}
    session, ks = secured.view.session, secured.keyspace
    rows = sum(len(list(session.execute(f"SELECT written FROM {ks}.{MAIL_HISTORY_GROUPS} WHERE history_key = %s", (k,))))
               for k in keys)
    day = int(time.time()) // 86_400
    name_rows = len(list(session.execute(f"SELECT at FROM {ks}.{MAIL_HISTORY_NAMES} WHERE name = %s AND day IN (%s, %s)",
                                         (name, day - 1, day))))
    print(f"60 mails enqueued together: {len(keys)} history keys, {rows} history rows, {name_rows} name rows")
    assert len(keys) <= 4 and rows == len(keys) and name_rows == len(keys)
    # And once delivered, every mail's story is whole, by its id and by the name
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        for _ in range(60):
            consumer.answer(consumer.next(), "SUCCESS")
    finally:
        consumer.close()
    wait_until(lambda: len(history(secured, name=name)) == 180, 30, what="60 mails' ENQUEUED, HANDED_OUT, DELIVERED by name")
    assert types(history(secured, enqueue_id=str(ids[17]))) == ["ENQUEUED", "HANDED_OUT", "DELIVERED"]


def test_a_success_whose_event_reached_no_stream_is_not_handed_out_again_and_its_event_is_written_when_it_comes_back(secured):
    """A SUCCESS writes its DELIVERED event and its deleted mark at once. When the event cannot
    reach the stream (deleted under dequeue_svc, which may not declare it again), the answer fails
    with the mark written: the mail comes back, is skipped (it was delivered, it is not handed out
    again), and the skip writes its event. One DELIVERED, in the history and in the stream. Last
    of the module: it deletes the module's event stream."""
    import pika

    from services.domain import names
    from stack.harness import broker_parameters

    # Given a mail handed out, and the event stream deleted under dequeue_svc
    queue = new_queue(secured)
    eid = stub(secured, "enqueue", "producer").Enqueue(inline(queue, simple_mail("lost-stream"))).receipt.enqueue_id
    consumer = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    delivery = consumer.next()
    with pika.BlockingConnection(broker_parameters()) as conn:
        conn.channel().queue_delete(names.event_stream(secured.keyspace))
    try:
        # When the consumer answers SUCCESS: the event reaches the history, not the stream
        consumer.answer(delivery, "SUCCESS")
        with pytest.raises(EOFError, match="UNAVAILABLE"):
            consumer.response(timeout=30)
    finally:
        consumer.cancel()
    assert types(history(secured, enqueue_id=eid)) == ["ENQUEUED", "HANDED_OUT", "DELIVERED"]
    # And once the stream is back (as browse_svc declares it), the mail comes back to a consumer
    stream = secured.browse.app.backends().stream
    with pika.BlockingConnection(broker_parameters()) as conn:
        channel = conn.channel()
        channel.queue_declare(stream.name, durable=True, arguments=stream.arguments())
        channel.queue_bind(stream.name, stream.name)
    skipped = ("dequeue", "mailqueue_skipped_total")
    before = secured.metric(*skipped, queue=queue, reason="deleted")
    again = StreamConsumer(stub(secured, "dequeue", "consumer"), queue)
    try:
        wait_until(lambda: secured.metric(*skipped, queue=queue, reason="deleted") > before, 30, what="the mail skipped")
    finally:
        again.close()
    # Then it was handed out once, and its DELIVERED event is in the history once and in the stream
    assert secured.metric("dequeue", "mailqueue_delivered_total", queue=queue) == 1
    story = history(secured, enqueue_id=eid)
    assert types(story) == ["ENQUEUED", "HANDED_OUT", "DELIVERED"]
    watch = stub(secured, "events", "reader").WatchEvents(
        T.WatchEventsRequest(from_oldest=True, queues=[queue], types=[T.EVENT_TYPE_DELIVERED]), timeout=30)
    try:
        assert next(watch).event.id == story[-1].id
    finally:
        watch.cancel()

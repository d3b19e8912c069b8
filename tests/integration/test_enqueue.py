"""EnqueueService through gRPC on the real stack: what is stored, and what is refused."""

import hashlib
import os
import queue as q

import grpc
import pytest

from mailqueue.v1 import blob_pb2, enqueue_pb2, mail_pb2
from services.adapters.cassandra import schema
from services.contract import serde
from stack.harness import wait_until
from tests.integration.helpers import StreamConsumer, inline, message_count, peek_messages, simple_mail, view_rows
from tests.mails import FULL_MAIL


@pytest.fixture
def suite(contract_suite):
    """This module is the enqueue contract suite: each test runs against the services in-process
    and as separate processes (tests/conftest.py contract_suite)."""
    return contract_suite


def full_mail() -> mail_pb2.Mail:
    return serde.mail_to_proto(FULL_MAIL)


def blob_bytes(suite, blob_ids) -> bytes:
    return b"".join(
        r.chunk for b in blob_ids for r in suite.blob_stub.Get(blob_pb2.GetRequest(blob_id=b))
    )


def test_every_field_survives_in_the_view_row_and_the_message(suite):
    queue = suite.new_queue()
    sent = full_mail()
    content = b"Subject: full\r\n\r\n" + os.urandom(2000)
    r = suite.enqueue_stub.Enqueue(inline(queue, sent, content)).receipt

    [row] = view_rows(suite, queue)
    [message] = peek_messages(queue)
    expected = serde.mail_from_proto(sent)
    for stored in (row, message):
        assert stored.mail == expected
        assert str(stored.enqueue_id) == r.enqueue_id
        assert stored.blob_ids == (hashlib.sha256(content).hexdigest(),) and stored.size == len(content)
    assert row == message  # the message is the full mail reference, slice and bucket included
    assert blob_bytes(suite, r.blob_ids) == content


def test_the_null_sender_is_kept(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail(sender="")))
    [row] = view_rows(suite, queue)
    [message] = peek_messages(queue)
    assert row.mail.sender == "" and message.mail.sender == ""


def test_a_50_mib_mail_streams_through(suite):
    queue = suite.new_queue()
    content = os.urandom(50 * 1024 * 1024)

    def requests():
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail("big")))
        for i in range(0, len(content), 1024 * 1024):
            yield enqueue_pb2.EnqueueStreamRequest(chunk=content[i:i + 1024 * 1024])

    r = suite.enqueue_stub.EnqueueStream(requests(), timeout=120).receipt
    assert r.size == len(content) and r.blob_ids == [hashlib.sha256(content).hexdigest()]
    [row] = view_rows(suite, queue)
    assert row.size == len(content)
    assert blob_bytes(suite, row.blob_ids) == content


def test_content_can_reference_blobs_put_before(suite):
    queue = suite.new_queue()
    header, body = b"Subject: parts\r\n\r\n", os.urandom(5000)
    ids = [suite.blob_stub.Put(iter([blob_pb2.PutRequest(chunk=part)])).blob_id for part in (header, body)]
    r = suite.enqueue_stub.Enqueue(
        enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=ids))
    ).receipt
    assert r.size == len(header) + len(body)
    [message] = peek_messages(queue)
    assert list(message.blob_ids) == ids and blob_bytes(suite, ids) == header + body


def test_duplicate_mail_names_are_accepted(suite):
    queue = suite.new_queue()
    ids = {suite.enqueue_stub.Enqueue(inline(queue, simple_mail("same"))).receipt.enqueue_id for _ in range(3)}
    assert len(ids) == 3
    assert [r.mail.name for r in view_rows(suite, queue)] == ["same"] * 3
    assert message_count(queue) == 3


def test_an_idempotency_key_returns_the_first_enqueue(suite):
    queue = suite.new_queue()
    first = suite.enqueue_stub.Enqueue(inline(queue, simple_mail(), key="order-42")).receipt
    again = suite.enqueue_stub.Enqueue(inline(queue, simple_mail(), key="order-42")).receipt
    assert (again.enqueue_id, again.duplicate, first.duplicate) == (first.enqueue_id, True, False)
    assert again.blob_ids == first.blob_ids and again.size == first.size
    assert len(view_rows(suite, queue)) == 1 and message_count(queue) == 1
    other = suite.enqueue_stub.Enqueue(inline(queue, simple_mail(), key="order-43")).receipt
    assert other.enqueue_id != first.enqueue_id and message_count(queue) == 2


def test_a_key_whose_claim_expired_cell_by_cell_enqueues_a_new_mail(suite):
    """An idempotency row keeps its cells for the table's TTL (24 h) from each one's own write: the
    claim's enqueue id expired before the commit's cells did, and a reuse of the key in between
    was answered duplicate with enqueue id "None". Such a row is what is left of no claim."""
    import datetime as dt


    queue, key = suite.new_queue(), "expired-cell-by-cell"
    suite.view.session.execute(  # the row as that expiry leaves it: committed, no enqueue id
        f"INSERT INTO {suite.keyspace}.{schema.IDEMPOTENCY} (queue_name, idempotency_key, committed, enqueued_at, size) "
        "VALUES (%s, %s, true, %s, 5)", (queue, key, dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=30)))
    r = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("again"), key=key)).receipt
    assert not r.duplicate and r.enqueue_id not in ("", "None")
    assert [m.mail.name for m in view_rows(suite, queue)] == ["again"]
    again = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("again"), key=key)).receipt
    assert again.duplicate and again.enqueue_id == r.enqueue_id


def test_an_abandoned_idempotency_claim_is_taken_over_and_a_late_undo_cannot_delete_it(suite):
    """An attempt that claimed a key and never committed (crashed, or failed during a quorum loss
    with its undo still pending) leaves the claim; after 30 s a retry takes it over with the same
    enqueue id. The abandoned attempt's undo landing late must not delete the acknowledged mail
    (found on the 3-node cluster: 1 acked mail lost with two of three nodes down)."""
    import datetime as dt
    import uuid

    queue = suite.new_queue()
    abandoned = uuid.uuid4()
    # What the abandoned attempt left: its claim, 40 s old (the state a crash leaves in the view)...
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(seconds=40)
    assert suite.run(suite.view.idempotency.claim(queue, "order-7", abandoned, started)) is None
    # ...and its undo, written as the enqueuer writes it: at its start time plus 1 µs.
    undo_at = started + dt.timedelta(microseconds=1)
    suite.run(suite.view.mails.mark(queue, abandoned, "enqueue failed: view write", undo_at))
    receipt = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("retry"), key="order-7")).receipt
    assert (receipt.enqueue_id, receipt.duplicate) == (str(abandoned), False)
    # The undo is retried and lands once more, after the take-over: it loses (last write wins).
    suite.run(suite.view.mails.mark(queue, abandoned, "enqueue failed: view write", undo_at))
    assert suite.run(suite.view.mails.reason(queue, abandoned)) is None
    again = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("retry"), key="order-7")).receipt
    assert (again.enqueue_id, again.duplicate) == (str(abandoned), True)
    consumer = StreamConsumer(suite.dequeue_stub, queue)
    d = consumer.next()
    assert d.mail.enqueue_id == str(abandoned)
    consumer.answer(d)
    consumer.close()
    # A consumer's SUCCESS is written now, after every undo: a later take-over would not revive it.
    wait_until(lambda: suite.run(suite.view.mails.reason(queue, abandoned)) == "dequeued", 10, what="the SUCCESS mark")
    suite.run(suite.view.mails.unmark(queue, abandoned, undo_at + dt.timedelta(microseconds=1)))
    assert suite.run(suite.view.mails.reason(queue, abandoned)) == "dequeued"


def test_a_retry_that_took_a_claim_over_and_failed_before_writing_leaves_one_mail(suite):
    """An attempt wrote its row and published, then died before its commit. A retry took its claim
    over (keeping its enqueue id) and failed before writing its own row (its client left mid-stream):
    its undo only released the claim, so the next retry claimed a new id, and both mails were
    delivered. The taken-over id is marked by that undo: one mail for the key."""
    import datetime as dt
    import threading
    import uuid

    from mailqueue.v1 import enqueue_pb2

    queue = suite.new_queue()
    # What the dead attempt left: its mail written and published, and its claim, 40 s old.
    first = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("first"))).receipt
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(seconds=40)
    assert suite.run(suite.view.idempotency.claim(queue, "order-9", uuid.UUID(first.enqueue_id), started)) is None
    # The retry: a stream that takes the claim over, then its client leaves before the content ends.
    sent = threading.Event()

    def requests():
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail("retry"),
                                                                                idempotency_key="order-9"))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=b"x" * 100_000)
        sent.set()
        threading.Event().wait(30)  # never ends: the call is cancelled first

    taken = suite.metric("enqueue", "mailqueue_enqueue_claims_taken_over_total", reason="abandoned")
    call = suite.enqueue_stub.EnqueueStream.future(requests())
    assert sent.wait(10)
    wait_until(lambda: suite.metric("enqueue", "mailqueue_enqueue_claims_taken_over_total", reason="abandoned") > taken, 30,
               what="the claim taken over")
    call.cancel()
    wait_until(lambda: suite.run(suite.view.mails.reason(queue, uuid.UUID(first.enqueue_id))) is not None, 30,
               what="the taken-over enqueue id marked by the retry's undo")
    # The undo releases the claim after that mark. Until then a retry on this replica takes the
    # claim over at once, keeping the id (the "failed here" path, one mail all the same): this
    # test is about the release, so it waits for the claim's row to be gone.
    claim_row = f"SELECT enqueue_id FROM {suite.keyspace}.{schema.IDEMPOTENCY} WHERE queue_name = %s AND idempotency_key = %s"
    wait_until(lambda: suite.view.session.execute(claim_row, (queue, "order-9")).one() is None, 30, what="the claim released")
    third = wait_until(lambda: _keyed(suite, queue, "order-9"), 30, what="the key enqueued again")
    assert third.enqueue_id != first.enqueue_id and not third.duplicate
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=4)
    assert consumer.next().mail.enqueue_id == third.enqueue_id
    with pytest.raises(q.Empty):
        consumer.next(timeout=2)  # the first one is skipped as deleted, never delivered
    consumer.close()


def _keyed(suite, queue: str, key: str):
    """The receipt of an Enqueue with ``key``, None while the claim is held (ABORTED)."""
    try:
        return suite.enqueue_stub.Enqueue(inline(queue, simple_mail("third"), key=key)).receipt
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.ABORTED:
            return None
        raise


@pytest.fixture(scope="module")
def quick_claims(aio_loop, running_stack):
    """Services that take a claim for abandoned after 1 s (MAILQUEUE_ABANDONED_CLAIM_S)."""
    from stack.harness import new_keyspace
    from tests.conftest import Suite

    s = Suite(aio_loop, new_keyspace(), MAILQUEUE_ABANDONED_CLAIM_S="1")
    yield s
    s.stop(drop=True)


def test_an_attempt_whose_claim_a_retry_took_over_does_not_answer_for_the_key(quick_claims):
    """A slow attempt (its stream paused past MAILQUEUE_ABANDONED_CLAIM_S) had its claim taken over
    by a retry, which failed (its client left mid-stream) and undid the enqueue id. The slow attempt
    then resumed, wrote, published and committed the key unconditionally: acknowledged, yet never
    delivered (its id marked by the retry's undo), and the key answered "duplicate" of it. Its commit
    is now refused: ABORTED, and the key enqueues anew, delivered."""
    import threading


    suite, queue, key = quick_claims, quick_claims.new_queue(), "order-slow"

    def header(name: str) -> enqueue_pb2.EnqueueStreamRequest:
        return enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(
            queue=queue, mail=simple_mail(name), idempotency_key=key))

    resume, paused = threading.Event(), threading.Event()

    def slow():
        yield header("slow")
        yield enqueue_pb2.EnqueueStreamRequest(chunk=b"a" * 1000)
        paused.set()
        resume.wait(60)
        yield enqueue_pb2.EnqueueStreamRequest(chunk=b"b" * 1000)

    first = suite.enqueue_stub.EnqueueStream.future(slow(), timeout=120)
    assert paused.wait(10)
    claimed = f"SELECT enqueue_id FROM {suite.keyspace}.{schema.IDEMPOTENCY} WHERE queue_name = %s AND idempotency_key = %s"
    wait_until(lambda: suite.view.session.execute(claimed, (queue, key)).one(), 10, what="the slow attempt's claim")

    def taken_over_then_left() -> bool:
        """A retry: ABORTED while the slow attempt's claim is fresh; once it is abandoned, the retry
        takes it over and its client leaves before its content ends."""
        before = suite.metric("enqueue", "mailqueue_enqueue_claims_taken_over_total", reason="abandoned")

        def retry():
            yield header("retry")
            yield enqueue_pb2.EnqueueStreamRequest(chunk=b"c" * 1000)
            threading.Event().wait(60)

        call = suite.enqueue_stub.EnqueueStream.future(retry(), timeout=60)
        over = lambda: suite.metric("enqueue", "mailqueue_enqueue_claims_taken_over_total", reason="abandoned") > before  # noqa: E731
        wait_until(lambda: call.done() or over(), 10, what="the retry refused or taken over")
        if over():
            call.cancel()
            return True
        assert call.exception().code() == grpc.StatusCode.ABORTED, call.exception()
        return False

    wait_until(taken_over_then_left, 20, interval=0.3, what="a retry that took the claim over")
    wait_until(lambda: suite.view.session.execute(claimed, (queue, key)).one() is None, 30,
               what="the retry's undo: the enqueue id marked, the claim released")
    resume.set()
    with pytest.raises(grpc.RpcError) as e:
        first.result()
    assert e.value.code() == grpc.StatusCode.ABORTED and "taken over" in e.value.details(), e.value.details()
    again = wait_until(lambda: _keyed(suite, queue, key), 30, what="the key enqueued anew")
    assert not again.duplicate
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=4)
    assert consumer.next().mail.enqueue_id == again.enqueue_id
    with pytest.raises(q.Empty):
        consumer.next(timeout=2)  # one mail for the key
    consumer.close()


def test_equal_content_of_two_mails_is_stored_once(suite):
    queue = suite.new_queue()
    a = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("a"), b"same content")).receipt
    b = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("b"), b"same content")).receipt
    assert a.blob_ids == b.blob_ids and a.enqueue_id != b.enqueue_id


def test_rows_land_in_the_slice_and_bucket_of_the_message(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail()))
    [row] = view_rows(suite, queue)
    config = suite.run(suite.view.config.current())
    assert row.slice_start <= row.enqueued_at < row.slice_start + config.slice_window
    assert 0 <= row.bucket < config.bucket_count


# ---------------------------------------------------------------- refused input writes nothing
REFUSED = {
    "bad queue name": (lambda q: inline("no/slash", simple_mail()), grpc.StatusCode.INVALID_ARGUMENT),
    "no recipient": (lambda q: inline(q, simple_mail(recipients=())), grpc.StatusCode.INVALID_ARGUMENT),
    "bad recipient": (lambda q: inline(q, simple_mail(recipients=("ok@x.y", "not an address"))), grpc.StatusCode.INVALID_ARGUMENT),
    "bad sender": (lambda q: inline(q, simple_mail(sender="alice@")), grpc.StatusCode.INVALID_ARGUMENT),
    "no content": (lambda q: enqueue_pb2.EnqueueRequest(queue=q, mail=simple_mail()), grpc.StatusCode.INVALID_ARGUMENT),
    "inline too large": (lambda q: inline(q, simple_mail(), b"x" * (3 * 1024 * 1024 + 1)), grpc.StatusCode.RESOURCE_EXHAUSTED),
    "too many attributes": (
        lambda q: inline(q, mail_pb2.Mail(recipients=["a@b.c"], attributes={f"k{i}": "v" for i in range(129)})),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    "attribute too large": (
        lambda q: inline(q, mail_pb2.Mail(recipients=["a@b.c"], attributes={"k": "v" * 70000})),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    "unknown blob": (
        lambda q: enqueue_pb2.EnqueueRequest(queue=q, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=["e" * 64])),
        grpc.StatusCode.NOT_FOUND,
    ),
    "malformed blob id": (
        lambda q: enqueue_pb2.EnqueueRequest(queue=q, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=["xyz"])),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "unknown queue": (lambda q: inline("never-created-queue", simple_mail()), grpc.StatusCode.NOT_FOUND),
    "empty inline content": (lambda q: inline(q, simple_mail(), b""), grpc.StatusCode.INVALID_ARGUMENT),
    "control character in the name": (lambda q: inline(q, simple_mail("bad\x1bname")), grpc.StatusCode.INVALID_ARGUMENT),
    "terminal escape in a quoted sender": (lambda q: inline(q, simple_mail(sender='"\x1b]0;x\x07"@example.com')),
                                           grpc.StatusCode.INVALID_ARGUMENT),
    "NUL in a quoted recipient": (lambda q: inline(q, simple_mail(recipients=('"a\x00b"@example.com',))), grpc.StatusCode.INVALID_ARGUMENT),
    "NUL in a header value": (lambda q: inline(q, mail_pb2.Mail(recipients=["a@b.c"], per_recipient_headers=[
        mail_pb2.PerRecipientHeaders(recipient="a@b.c", headers=[mail_pb2.Header(name="X-Id", value="a\x00b")])])),
        grpc.StatusCode.INVALID_ARGUMENT),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_input_gets_the_same_status_in_enqueue_many(suite, case):
    """The unary call and a stream of many answer one bad mail alike, and the stream goes on."""
    queue = suite.new_queue()
    build, code = REFUSED[case]
    requests = [enqueue_pb2.EnqueueManyRequest(sequence=1, request=build(queue)),
                enqueue_pb2.EnqueueManyRequest(sequence=2, request=inline(queue, simple_mail("good")))]
    answers = {r.sequence: r for r in suite.enqueue_stub.EnqueueMany(iter(requests), timeout=60)}
    assert answers[1].error.code == code.value[0], answers[1]
    assert answers[2].HasField("receipt")
    assert [m.mail.name for m in view_rows(suite, queue)] == ["good"]


def test_a_sequence_still_unanswered_sent_again_ends_the_stream_and_the_rest_is_not_enqueued(suite):
    queue = suite.new_queue()
    requests = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in (1, 2, 2, 3)]
    answered = []
    with pytest.raises(grpc.RpcError) as e:
        for r in suite.enqueue_stub.EnqueueMany(iter(requests), timeout=60):
            answered.append(r.sequence)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sequence 2" in e.value.details()
    # Each sequence answered once at most; the duplicate and what followed it are not enqueued
    assert len(answered) == len(set(answered)) and set(answered) <= {1, 2}
    assert sorted(m.mail.name for m in view_rows(suite, queue)) == sorted(f"m{s}" for s in answered)
    assert "m3" not in {m.mail.name for m in view_rows(suite, queue)}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_input_gets_a_precise_status_and_writes_nothing(suite, case):
    queue = suite.new_queue()
    build, code = REFUSED[case]
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.Enqueue(build(queue))
    assert e.value.code() == code, e.value.details()
    assert e.value.details()  # says what to fix
    assert view_rows(suite, queue) == [] and message_count(queue) == 0


def test_a_stream_over_the_mail_size_limit_is_refused_and_writes_nothing(suite, aio_loop, keyspace):
    from enqueue_svc.app import EnqueueApp
    from stack.harness import service_env
    from tests.inprocess import RunningApp

    small = RunningApp(aio_loop, EnqueueApp, "enqueue",
                       service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target, MAILQUEUE_MAX_MAIL_BYTES="100000"))
    try:
        from mailqueue.v1 import enqueue_pb2_grpc

        stub = enqueue_pb2_grpc.EnqueueServiceStub(small.channel())
        queue = suite.new_queue()
        content = os.urandom(200_000)

        def requests():
            yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail()))
            for i in range(0, len(content), 50_000):
                yield enqueue_pb2.EnqueueStreamRequest(chunk=content[i:i + 50_000])

        with pytest.raises(grpc.RpcError) as e:
            stub.EnqueueStream(requests())
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert view_rows(suite, queue) == [] and message_count(queue) == 0
        # The same bytes inline (under the inline limit) are refused alike
        with pytest.raises(grpc.RpcError) as inline_e:
            stub.Enqueue(inline(queue, simple_mail(), content))
        assert inline_e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "100000" in inline_e.value.details()
        assert view_rows(suite, queue) == [] and message_count(queue) == 0
        with pytest.raises(grpc.RpcError) as e:
            suite.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content).hexdigest()))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        small.stop()


def test_a_blob_larger_than_any_mail_is_refused_by_blob_svc(aio_loop, keyspace):
    """blob_svc stored a blob up to MAILQUEUE_MAX_BLOB_BYTES (1 GiB) though no Enqueue can name one
    over MAILQUEUE_MAX_MAIL_BYTES (100 MiB): it stayed for the retention sweep. Its limit is now
    the smaller of the two: RESOURCE_EXHAUSTED, nothing stored."""
    from blob_svc.app import BlobApp
    from mailqueue.v1 import blob_pb2_grpc
    from stack.harness import service_env
    from tests.inprocess import RunningApp

    small = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_MAX_MAIL_BYTES="100000"))
    try:
        stub = blob_pb2_grpc.BlobServiceStub(small.channel())
        content = os.urandom(150_000)
        with pytest.raises(grpc.RpcError) as e:
            stub.Put(iter([blob_pb2.PutRequest(chunk=content[i:i + 50_000]) for i in range(0, len(content), 50_000)]))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content).hexdigest()))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert stub.Put(iter([blob_pb2.PutRequest(chunk=content[:90_000])])).blob_id == hashlib.sha256(content[:90_000]).hexdigest()
    finally:
        small.stop()


def test_blob_refs_to_empty_blobs_alone_are_refused_as_an_empty_mail(suite):
    """Empty inline content and an empty stream are INVALID_ARGUMENT (a producer whose read
    failed); blob refs naming only the empty blob (a Put of no chunk) queued a 0-byte mail."""
    queue = suite.new_queue()
    empty = suite.blob_stub.Put(iter([])).blob_id
    request = enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=[empty, empty]))
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.Enqueue(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no content" in e.value.details()
    assert view_rows(suite, queue) == [] and message_count(queue) == 0
    body = suite.blob_stub.Put(iter([blob_pb2.PutRequest(chunk=b"Subject: s\r\n\r\nbody")])).blob_id
    twice = enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=[body, empty, body]))
    assert suite.enqueue_stub.Enqueue(twice).receipt.enqueue_id  # a blob named twice counts twice, read once
    assert [m.size for m in view_rows(suite, queue)] == [2 * len(b"Subject: s\r\n\r\nbody")]


def test_blob_refs_are_read_only_once_the_queue_is_known_to_take_mail(suite):
    """Blob refs to a queue that does not exist are refused for the queue: no blob is read or
    refreshed for a mail refused for something else (its size is read just before the quotas)."""
    missing = "d" * 64
    request = enqueue_pb2.EnqueueRequest(queue="never-created-queue", mail=simple_mail(),
                                         blob_refs=enqueue_pb2.BlobRefs(blob_ids=[missing]))
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.Enqueue(request)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "never-created-queue" in e.value.details() and missing not in e.value.details()


def test_a_stream_must_start_with_its_header(suite):
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.EnqueueStream(iter([enqueue_pb2.EnqueueStreamRequest(chunk=b"x")]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_stream_with_a_header_and_no_content_is_refused_and_writes_nothing(suite):
    """A producer whose file read failed half-closes after the header: as a unary Enqueue with no
    content, INVALID_ARGUMENT, and no empty mail queued."""
    queue = suite.new_queue()
    header = enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail("empty")))
    with pytest.raises(grpc.RpcError) as e:
        suite.enqueue_stub.EnqueueStream(iter([header]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no content" in e.value.details()
    assert view_rows(suite, queue) == [] and message_count(queue) == 0


def test_enqueue_many_answers_every_mail_on_one_stream_refusing_bad_ones_alone(suite):
    from mailqueue.v1 import enqueue_pb2

    queue = suite.new_queue()
    requests = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(50)]
    requests[7].request.mail.ClearField("recipients")  # refused: INVALID_ARGUMENT
    requests[9].request.queue = "no-such-queue"  # refused: NOT_FOUND
    answers = {r.sequence: r for r in suite.enqueue_stub.EnqueueMany(iter(requests))}
    assert sorted(answers) == list(range(50))
    assert answers[7].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "recipient" in answers[7].error.message
    assert answers[9].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    ok = {s: a.receipt.enqueue_id for s, a in answers.items() if a.WhichOneof("result") == "receipt"}
    assert len(ok) == 48
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=48)
    got = c.take(48)
    assert sorted(d.mail.enqueue_id for d in got) == sorted(ok.values())
    c.cancel()


def test_enqueue_batches_answers_every_mail_once_in_results_messages(suite):
    from mailqueue.v1 import enqueue_pb2

    queue = suite.new_queue()
    mails = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(50)]
    mails[7].request.mail.ClearField("recipients")  # refused: INVALID_ARGUMENT, the others go on
    batches = [enqueue_pb2.EnqueueBatchesRequest(mails=mails[i:i + 20]) for i in (0, 20, 40)]
    messages = list(suite.enqueue_stub.EnqueueBatches(iter(batches)))
    answers = [r for m in messages for r in m.results]
    assert sorted(a.sequence for a in answers) == list(range(50)) and 1 <= len(messages) <= 50
    refused = [a for a in answers if a.WhichOneof("result") == "error"]
    assert [(a.sequence, a.error.code) for a in refused] == [(7, grpc.StatusCode.INVALID_ARGUMENT.value[0])]
    assert message_count(queue) == 49


def test_an_empty_batch_ends_the_stream_after_answering_the_mails_before_it(suite):
    from mailqueue.v1 import enqueue_pb2

    queue = suite.new_queue()
    first = enqueue_pb2.EnqueueBatchesRequest(mails=[
        enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(5)])
    answered = []
    with pytest.raises(grpc.RpcError) as e:
        for m in suite.enqueue_stub.EnqueueBatches(iter([first, enqueue_pb2.EnqueueBatchesRequest()])):
            answered += [a.sequence for a in m.results if a.WhichOneof("result") == "receipt"]
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at least one mail" in e.value.details()
    assert sorted(answered) == list(range(5))
    assert message_count(queue) == 5


def test_rows_of_concurrent_enqueues_share_requests_and_every_one_lands(suite):
    # 300 mails on one EnqueueMany stream (128 in flight): their rows are group-committed into
    # single-partition batches, and each mail is in the view and in the queue exactly once.
    from mailqueue.v1 import browse_pb2, enqueue_pb2

    def histogram(suffix: str) -> float:
        return suite.metric("enqueue", f"mailqueue_view_group_commit_statements_{suffix}")

    queue = suite.new_queue()
    before = histogram("count"), histogram("sum")
    requests = (enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(300))
    answers = list(suite.enqueue_stub.EnqueueMany(requests))
    assert [a.WhichOneof("result") for a in answers] == ["receipt"] * 300
    requests_sent, rows_sent = histogram("count") - before[0], histogram("sum") - before[1]
    assert rows_sent == 300 and requests_sent < 300, f"{requests_sent} requests for 300 rows"
    ids = sorted(a.receipt.enqueue_id for a in answers)
    assert sorted(str(r.enqueue_id) for r in view_rows(suite, queue)) == ids
    assert suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size == 300
    assert message_count(queue) == 300


def test_concurrent_unary_enqueues_run_as_groups_and_each_call_keeps_its_own_outcome(suite):
    # 200 single Enqueue calls at once, as SMTP servers send: the server runs them in groups
    # (services/app/enqueue_group.py), yet every call gets its own answer. The bad ones among them
    # are refused before any group and write nothing; every good one is in the view and the
    # queue once.
    queue = suite.new_queue()
    before = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_count"), suite.metric(
        "enqueue", "mailqueue_enqueue_grouped_calls_sum")
    bad = {
        17: (inline(queue, simple_mail(recipients=("not an address",))), grpc.StatusCode.INVALID_ARGUMENT),
        90: (inline("no-such-queue-" + queue, simple_mail()), grpc.StatusCode.NOT_FOUND),
        151: (inline(queue, simple_mail(sender="alice@")), grpc.StatusCode.INVALID_ARGUMENT),
    }
    calls = [suite.enqueue_stub.Enqueue.future(bad[i][0] if i in bad else inline(queue, simple_mail(f"m{i}")), timeout=60)
             for i in range(200)]
    receipts = {}
    for i, call in enumerate(calls):
        if i in bad:
            with pytest.raises(grpc.RpcError) as refused:
                call.result()
            assert refused.value.code() == bad[i][1], (i, refused.value.details())
        else:
            receipts[i] = call.result().receipt
    groups = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_count") - before[0]
    grouped = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_sum") - before[1]
    assert grouped == 197 and groups < grouped, f"{groups} groups for {grouped} calls"  # the bad ones: refused first
    assert sorted(str(r.enqueue_id) for r in view_rows(suite, queue)) == sorted(r.enqueue_id for r in receipts.values())
    assert len(set(r.enqueue_id for r in receipts.values())) == 197
    assert message_count(queue) == 197


def test_concurrent_streams_put_their_content_alone_and_land_their_rows_as_groups(suite):
    # 40 EnqueueStream calls of 100 KB at once: each streams its content to the blob store, then
    # its row and publish join a group; each receipt names its own content.
    queue = suite.new_queue()
    before = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_count"), suite.metric(
        "enqueue", "mailqueue_enqueue_grouped_calls_sum")
    bodies = [os.urandom(100_000) for _ in range(40)]

    def parts(body: bytes):  # noqa: ANN202
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail()))
        for at in range(0, len(body), 64 * 1024):
            yield enqueue_pb2.EnqueueStreamRequest(chunk=body[at:at + 64 * 1024])

    calls = [suite.enqueue_stub.EnqueueStream.future(parts(b), timeout=60) for b in bodies]
    receipts = [c.result().receipt for c in calls]
    assert [r.blob_ids[0] for r in receipts] == [hashlib.sha256(b).hexdigest() for b in bodies]
    groups = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_count") - before[0]
    grouped = suite.metric("enqueue", "mailqueue_enqueue_grouped_calls_sum") - before[1]
    assert grouped == 40 and groups <= grouped
    assert sorted(str(r.enqueue_id) for r in view_rows(suite, queue)) == sorted(r.enqueue_id for r in receipts)
    assert message_count(queue) == 40


def test_blob_refs_refresh_an_old_blobs_write_time_so_a_sweep_under_way_keeps_it(suite):
    """A blob no mail has referenced for longer than the sweep's blob grace, referenced again by an
    enqueue: its write time is refreshed (as a put of equal content does), so a sweep that read the
    rows before this mail's row does not delete the content of an acknowledged mail."""
    import datetime as dt

    queue = suite.new_queue()
    blob_id = suite.blob_stub.PutBytes(blob_pb2.PutBytesRequest(content=os.urandom(2000))).blob_id
    written_at = f"SELECT written_at FROM {suite.keyspace}.blobs_v1 WHERE blob_id = %s"
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)  # as two days without a reference leave it
    suite.view.session.execute(f"UPDATE {suite.keyspace}.blobs_v1 SET written_at = %s WHERE blob_id = %s", (old, blob_id))
    suite.enqueue_stub.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=[blob_id])))
    [row] = suite.view.session.execute(written_at, (blob_id,))
    assert row.written_at.replace(tzinfo=dt.timezone.utc) > dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)


def test_content_kept_in_cassandra_stays_deliverable_after_the_small_blob_limit_is_lowered(suite):
    """Small content is a row of blobs_v1; a dequeue_svc started later with a lower
    MAILQUEUE_SMALL_BLOB_BYTES (or 0: new blobs in S3 only) still reads it."""
    from mailqueue.v1 import dequeue_pb2_grpc
    from stack.harness import ServiceProcess, service_env

    queue = suite.new_queue()
    content = os.urandom(10_000)
    blob_id = suite.blob_stub.PutBytes(blob_pb2.PutBytesRequest(content=content)).blob_id
    for _ in ("0", "1000"):  # the references: no content carried in the message
        suite.enqueue_stub.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(), blob_refs=enqueue_pb2.BlobRefs(blob_ids=[blob_id])))
    for limit in ("0", "1000"):
        dequeue = ServiceProcess("dequeue", service_env(suite.keyspace, MAILQUEUE_SMALL_BLOB_BYTES=limit))
        try:
            c = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(dequeue.channel()), queue, prefetch=1)
            d = c.next()
            assert (d.content_inline, d.content == content) == (True, True), limit
            c.answer(d, "SUCCESS")
            c.close()
        finally:
            dequeue.stop()
